"""metrics.calibration.calibration_fields: the per-step fields the cluster simulator's calibration reads."""

from __future__ import annotations

from types import SimpleNamespace

from scalerl_mega.metrics.calibration import calibration_fields
from scalerl_mega.types import Completion, FinishReason, Group, Prompt, ScoredCompletion


def _group(pid: str, prompt_len: int, out_lens: list[int]) -> Group:
    samples = [ScoredCompletion(completion=Completion(
        prompt_id=pid, sample_index=i, prompt_ids=list(range(prompt_len)), output_ids=[5] * n,
        gen_logprobs=[0.0] * n, weight_versions=[0] * n, finish_reason=FinishReason.STOP), reward=1.0, passed=True)
        for i, n in enumerate(out_lens)]
    return Group(prompt=Prompt(prompt_id=pid, text="1+1", task="synthetic", gold="2"), samples=samples)


def test_calibration_fields_hand_worked():
    cfg = SimpleNamespace(
        train=SimpleNamespace(prompts_per_step=2, generations_per_prompt=2),
        rollout=SimpleNamespace(name="local", num_engines=1, max_batch_size=64, sglang_tp_size=4),
        cluster=SimpleNamespace(trainer_devices=1), off_policy=SimpleNamespace(name="pipeline_rl", k=2))
    groups = [_group("a", 3, [4, 6]), _group("b", 5, [1, 9])]
    f = calibration_fields(cfg, groups, train_s=1.5, sync_s=0.25, step_s=2.0)
    assert f["batch/gen_lengths"] == [4, 6, 1, 9]
    assert f["batch/tokens"] == (3 + 3 + 5 + 5) + (4 + 6 + 1 + 9)  # 36
    assert f["batch/prompt_tokens_mean"] == 4.0
    assert (f["timing/train_step_s"], f["timing/sync_s"], f["timing/step_wall_s"]) == (1.5, 0.25, 2.0)
    assert f["sim/batch_samples"] == 4 and f["sim/num_generators"] == 1 and f["sim/gpus_per_generator"] == 1
    assert f["sim/mode"] == "pipeline_rl" and f["sim/k"] == 2 and f["sim/trainer_gpus"] == 1
