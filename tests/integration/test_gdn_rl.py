"""`scalerl-train` RL steps (PPO-off-policy-1, FP32) on the tiny Qwen3.5-MoE checkpoint of `tools/make_tiny_checkpoint.py`
(Gated DeltaNet / gated attention / GDN, 4 experts top-2 with a gated shared expert; `init_from_hf`, so its recorded
CPU overrides apply under the command line's): the Megatron trainer (torch GDN path) pushes its weights after every
step, the local engine (transformers' Qwen3_5MoeForCausalLM: chunked prefill, recurrent decode over per-slot GDN
state) generates the next step's samples with them, and the trainer's log-probs of those samples equal the engine's
(on-policy |log-ratio| <= 1e-4 on every step, the guard in assert mode). No warm start: rewards are nearly all equal, so
`filter=none` keeps the samples and a large learning rate makes the MoE load-balancing loss move every weight; the
engine's weight digest then differs after every push, so the agreement is checked on three different models.

The same under torchrun on 2 gloo ranks at TP2 (with sequence parallelism: in_proj / conv / A_log / dt_bias split
by head over the ranks, out_proj row-parallel) and at EP2 (two experts a rank): each push gathers the shards into
the engine's HF tensors (the loop's first push too, before step 1), so the guard holding on every step means the
gathered GDN weights are the trainer's (the TP2 shards of in_proj / conv merged in the wrong rank order: 0.12 at
step 1).
The guard cannot see a trainer that trains the wrong weights consistently (a GDN gradient summed twice over TP),
so each layout also trains the same samples to the same loss and grad norm as the one-rank run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multirank_util import COMMON, REPO, assert_same_run, records, run_job

pytestmark = pytest.mark.compat  # 25-60 s a case on 2 loaded cores (1 rank, TP2, EP2): the compatibility
# leg of .ci/run runs them (make test-compat, and the default pin through COMPAT_ON_DEFAULT_PIN), not make test

ON_POLICY = 1e-4
GDN = ["sft.steps=0", "train.steps=3", "train.save_every=0",
       "filter=none", "optim.lr=1e-2", "metrics.weights_digest=true", f"metrics.max_logprob_mismatch={ON_POLICY}",
       "metrics.mismatch_mode=assert"]
LAYOUTS = {"tp2": ["parallel.tp=2", "parallel.sequence_parallel=true"], "ep2": ["parallel.ep=2"]}


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """The vocabulary padded to 48 rows (the task's tokenizer has 47 tokens): TP2 splits the embedding and head."""
    ckpt = tmp_path_factory.mktemp("gdn") / "ckpt"
    made = subprocess.run([sys.executable, "tools/make_tiny_checkpoint.py", "qwen3_5_moe", str(ckpt), "--vocab-size",
                           "48"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    return ckpt


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, tiny_ckpt):
    out = tmp_path_factory.mktemp("gdn_1rank")
    run_job(out, [*COMMON, *GDN, f"init_from_hf={tiny_ckpt}"])
    return out


def _check_guard(out):
    recs = records(out)
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert r["train/onpolicy_tokens"] > 0 and r["train/onpolicy_abs_log_ratio_max"] <= ON_POLICY
        assert r["train/grad_norm"] > 0 and r["staleness_max"] == 0
    assert len({r["gen/weights_sha256"] for r in recs}) == 3
    return recs


def test_qwen3_5_moe_engine_agrees_with_the_trainer_over_three_pushes(one_rank):
    assert "\n  arch: qwen3_5_moe\n" in (one_rank / "run_config.yaml").read_text()  # the checkpoint's model, not the demo's
    _check_guard(one_rank)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_qwen3_5_moe_engine_agrees_with_the_trainer_on_two_ranks(tmp_path, tiny_ckpt, one_rank, layout):
    out = tmp_path / layout
    run_job(out, [*COMMON, *GDN, f"init_from_hf={tiny_ckpt}", *LAYOUTS[layout]], nproc=2)
    config = (out / "run_config.yaml").read_text()
    assert "\n  arch: qwen3_5_moe\n" in config and f"\n  {layout[:2]}: 2\n" in config
    assert_same_run(records(one_rank), _check_guard(out))
