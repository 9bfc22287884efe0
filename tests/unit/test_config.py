"""Every experiment overlay composes with Hydra's compose API, validates, and maps the paper's recipe."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"

# The recipe of each experiment, written from the paper (Sec. 4; App. A.9 Fig. appendix_loo caption;
# App. A.15): (loss, eps_low, eps_high, aggregation, adv_norm, off_policy, k, length, curriculum,
# filter, precision, prompts_per_step).
SCALERL = ("cispo", None, 5.0, "prompt", "batch", "pipeline_rl", 8, "interruption",
           "no_positive_resampling", "zero_variance", "fp32_head", 48)
EXPECTED = {
    "scalerl": SCALERL,
    # LOO: revert one axis to the baseline counterpart.
    "loo_plan": SCALERL[:4] + ("prompt",) + SCALERL[5:],
    "loo_lp": SCALERL[:7] + ("penalty",) + SCALERL[8:],
    "loo_batch": SCALERL[:9] + ("none",) + SCALERL[10:],
    "loo_8op": SCALERL[:5] + ("ppo_off_policy", 8) + SCALERL[7:],
    "loo_fp32": SCALERL[:10] + ("bf16_head", 48),
    "loo_savg": SCALERL[:3] + ("sample",) + SCALERL[4:],
    "loo_dapo": ("dapo", 0.2, 0.26) + SCALERL[3:],
    # Prevalent recipes (App. A.15).
    "deepseek_grpo": ("grpo", 0.2, 0.2, "sample", "prompt", "ppo_off_policy", 8, "interruption",
                      "uniform", "none", "bf16_head", 48),
    "qwen_dapo": ("dapo", 0.2, 0.26, "prompt", "prompt", "ppo_off_policy", 8, "interruption",
                  "uniform", "zero_variance", "bf16_head", 80),
    "magistral": ("dapo", 0.2, 0.26, "prompt", "prompt", "pipeline_rl", 8, "interruption",
                  "uniform", "zero_variance", "bf16_head", 80),
    "minimax": ("cispo", None, 5.0, "prompt", "prompt", "ppo_off_policy", 8, "interruption",
                "uniform", "zero_variance", "fp32_head", 80),
}


# `make reproduce` (conf/experiment/repro_*.yaml): the demo's recipe with one axis reverted each.
DEMO = ("cispo", None, 5.0, "prompt", "batch", "pipeline_rl", 2, "interruption", "no_positive_resampling",
        "zero_variance", "fp32_head", 32)
REPRO = {
    "repro_scalerl": DEMO,
    "repro_dapo": ("dapo", 0.2, 0.26) + DEMO[3:],
    "repro_no_zvf": DEMO[:9] + ("none",) + DEMO[10:],
    "repro_no_fp32_head": DEMO[:10] + ("bf16_head", 32),
    "repro_no_npr": DEMO[:8] + ("uniform",) + DEMO[9:],
}


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from scalerl_mega.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["output_dir=/tmp/scalerl-test", *overrides])
    return OmegaConf.to_object(cfg)


def _recipe(c) -> tuple:
    return (c.loss.name, c.loss.eps_low, c.loss.eps_high, c.aggregation.name, c.adv_norm.name,
            c.off_policy.name, c.off_policy.k, c.length.name, c.curriculum.name, c.filter.name,
            c.precision.name, c.train.prompts_per_step)


def test_every_experiment_file_is_covered():
    on_disk = {p.stem for p in (CONF / "experiment").glob("*.yaml")}
    assert on_disk == set(EXPECTED) | set(REPRO) | set(REPRO3) | {"repro4_scalerl", "repro5_scalerl", "repro6_scalerl", "demo",
                                                                       "smollm2_cpu", "repro6_fast", "repro6_twin",
                                                                       "gpu_check"}


def test_gpu_check_experiment_is_a_half_billion_bf16_loop_on_one_device():
    """tools/gpu_check.sh's RL stage (conf/experiment/gpu_check.yaml): ~0.5B parameters, bf16 body and FP32 head,
    trainer and engine on one CUDA device (in-process engine), synchronous so that a resume regenerates the same
    samples, a save to resume from; rollout.in_process is refused where it cannot hold."""
    from scalerl_mega.config import validate

    c = _compose("experiment=gpu_check")
    validate(c)
    assert 0.45e9 < c.model.num_params()["total"] < 0.55e9
    assert c.precision.params_dtype == "bfloat16" and c.model.fp32_lm_head and c.cluster.device == "cuda"
    assert c.rollout.in_process and c.rollout.name == "local" and c.rollout.num_engines == 1
    assert (c.off_policy.name, c.off_policy.k, c.train.save_every, c.metrics.weights_digest) == (
        "ppo_off_policy", 1, 2, True)
    for bad, msg in (("rollout.num_engines=2", "num_engines=1"), ("rollout=sglang", "rollout.name=local")):
        with pytest.raises(ValueError, match=r"rollout.in_process=true needs .*" + msg):
            validate(_compose("experiment=gpu_check", bad))


# issue 29's sweep (reproduction/design/README.md): (prompts_per_step, steps, val_every, curriculum) per overlay
REPRO3 = {"repro3_scalerl": (32, 1600, 20, "no_positive_resampling"), "repro3_batch_control": (32, 1600, 20, "no_positive_resampling"),
          "repro3_batch_small": (16, 3200, 40, "no_positive_resampling"), "repro3_batch_large": (64, 800, 10, "no_positive_resampling"),
          "repro3_no_npr": (32, 1600, 20, "uniform")}


@pytest.mark.parametrize("name", sorted(REPRO3))
def test_repro3_overlays_share_the_design_and_change_one_thing(name):
    """Same samples generated and the same validation grid (200 prompts x 8 samples, 81 window points) in every
    overlay; only the batch size, the micro-batching (control) or the curriculum differs."""
    from scalerl_mega.config import validate

    c = _compose(f"experiment={name}")
    validate(c)
    ref = _compose("experiment=repro3_scalerl")
    per, steps, every, curriculum = REPRO3[name]
    assert (c.train.prompts_per_step, c.train.steps, c.train.val_every, c.curriculum.name) == (per, steps, every, curriculum)
    assert c.train.prompts_per_step * c.train.steps == 32 * 1600 and c.train.steps // c.train.val_every + 1 == 81
    assert (c.data.val_prompts, c.data.val_samples, c.data.synthetic_max_digits) == (200, 8, 6)
    assert (c.train.val_mode, c.data.synthetic_num_prompts, c.data.synthetic_difficulty_weights) == (
        "window", 24200, [0, 0, 1, 1, 0, 0.4])
    assert c.optim.lr == pytest.approx(5e-5) and c.optim.lr == ref.optim.lr
    assert c.run_name == name and c.loss.name == ref.loss.name and c.precision.name == ref.precision.name


def test_repro4_is_the_reference_at_twice_the_length_on_one_pass():
    """reproduction/repro4: repro3's reference recipe and validation grid; 3,200 steps (161 window points) over
    102,400 training prompts, each drawn once; its own warm start."""
    from scalerl_mega.config import validate

    c, ref = _compose("experiment=repro4_scalerl"), _compose("experiment=repro3_scalerl")
    validate(c)
    assert c.train.steps == 3200 and c.train.steps // c.train.val_every + 1 == 161
    assert c.data.synthetic_num_prompts - c.data.val_prompts == c.train.steps * c.train.prompts_per_step == 102_400
    assert c.sft.checkpoint == "outputs/reproduce4/sft" and c.run_name == "repro4_scalerl"
    differ = {"train.steps", "data.synthetic_num_prompts", "sft.checkpoint", "run_name"}
    from scalerl_mega.config.tree import flat_config

    mine, theirs = flat_config(c), flat_config(ref)
    assert {k for k in mine if mine[k] != theirs.get(k)} == differ


def test_repro5_is_repro4_at_twice_the_length_on_one_pass():
    """reproduction/repro5: repro4 at 6,400 steps (321 window points) over 204,800 training prompts, each drawn
    once; its own warm start; nothing else changes."""
    from scalerl_mega.config import validate
    from scalerl_mega.config.tree import flat_config

    c, ref = _compose("experiment=repro5_scalerl"), _compose("experiment=repro4_scalerl")
    validate(c)
    assert c.train.steps == 6400 and c.train.steps // c.train.val_every + 1 == 321
    assert c.data.synthetic_num_prompts - c.data.val_prompts == c.train.steps * c.train.prompts_per_step == 204_800
    assert c.sft.checkpoint == "outputs/reproduce5/sft" and c.run_name == "repro5_scalerl"
    mine, theirs = flat_config(c), flat_config(ref)
    assert {k for k in mine if mine[k] != theirs.get(k)} == {"train.steps", "data.synthetic_num_prompts",
                                                            "sft.checkpoint", "run_name"}


def test_repro6_is_repro5_from_repro4s_warm_start():
    """reproduction/repro6: repro5 unchanged but for the warm start, which is repro4's (its fingerprint, so
    outputs/reproduce4/sft loads as is); nothing else changes."""
    import json

    from scalerl_mega.config import validate
    from scalerl_mega.config.tree import flat_config
    from scalerl_mega.train import sft_fingerprint

    c, r5, r4 = (_compose(f"experiment={e}") for e in ("repro6_scalerl", "repro5_scalerl", "repro4_scalerl"))
    validate(c)
    assert c.sft.synthetic_num_prompts == r4.data.synthetic_num_prompts == 102_600
    assert c.sft.checkpoint == "outputs/reproduce6/sft" and c.run_name == "repro6_scalerl"
    mine, theirs = flat_config(c), flat_config(r5)
    assert {k for k in mine if mine[k] != theirs.get(k)} == {"sft.checkpoint", "sft.synthetic_num_prompts",
                                                            "run_name"}
    assert json.dumps(sft_fingerprint(c), sort_keys=True) == json.dumps(sft_fingerprint(r4), sort_keys=True)
    assert sft_fingerprint(c) != sft_fingerprint(r5)


def test_repro6_fast_is_repro6_on_two_engines_behind_the_trainer():
    """reproduction/repro6_fast (issue 29 item 1): repro6's recipe, data and warm start; only the engine processes
    (two, at niceness +10), the weight transport (flattened buckets), the checkpoint interval and the run name
    differ, and every one of those may change when a run resumes."""
    from scalerl_mega.run_dir import _resumable
    from scalerl_mega.config import validate
    from scalerl_mega.config.tree import flat_config
    from scalerl_mega.train import sft_fingerprint

    c, r6 = _compose("experiment=repro6_fast"), _compose("experiment=repro6_scalerl")
    validate(c)
    mine, theirs = flat_config(c), flat_config(r6)
    diff = {k: mine[k] for k in mine if mine[k] != theirs.get(k)}
    assert diff == {"rollout.num_engines": 2, "rollout.engine_nice": 10, "rollout.weight_sync_flattened": True,
                    "train.save_every": 200, "run_name": "repro6_fast"}
    assert [k for k in diff if not _resumable(k)] == ["rollout.num_engines"]
    assert sft_fingerprint(c) == sft_fingerprint(r6) and c.sft.checkpoint == "outputs/reproduce6/sft"


def test_repro6_twin_is_repro6_fast_with_one_engines_rows_split_between_two():
    """reproduction/repro6_twin (issue 29 item 1): repro6_fast with 128 decode rows per engine, so that the two
    engines hold as many samples in flight as repro6's one engine (256), and nothing else. The row count is not a
    resumable key: it sets how stale the generated tokens are (reproduction/repro6_twin/README.md)."""
    from scalerl_mega.config import validate
    from scalerl_mega.config.tree import flat_config
    from scalerl_mega.run_dir import _resumable

    c, fast, r6 = (_compose(f"experiment={e}") for e in ("repro6_twin", "repro6_fast", "repro6_scalerl"))
    validate(c)
    mine, theirs = flat_config(c), flat_config(fast)
    assert {k: mine[k] for k in mine if mine[k] != theirs.get(k)} == {"rollout.max_batch_size": 128,
                                                                       "run_name": "repro6_twin"}
    assert c.rollout.num_engines * c.rollout.max_batch_size == r6.rollout.num_engines * r6.rollout.max_batch_size
    assert not _resumable("rollout.max_batch_size")


@pytest.mark.parametrize("name", sorted(REPRO))
def test_reproduce_overlays_revert_one_axis_of_the_demo(name):
    """Same sizes as each other (only the recipe differs), FP32 body, one shared warm start per seed."""
    from scalerl_mega.config import validate
    from scalerl_mega.train import sft_fingerprint

    c = _compose(f"experiment={name}", "seed=2")
    validate(c)
    assert _recipe(c) == REPRO[name] and c.run_name == name
    assert (c.train.steps, c.train.val_every, c.data.val_prompts, c.data.val_samples, c.sft.steps) == (50, 5, 100, 4, 250)
    assert c.precision.params_dtype == "float32"
    assert c.sft.checkpoint == "outputs/reproduce/sft" and c.sft.any_seed
    assert sft_fingerprint(c) == sft_fingerprint(_compose("experiment=repro_scalerl", "seed=2"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_experiment_composes_validates_and_matches_paper(name):
    from scalerl_mega.config import TrainConfig, validate

    c = _compose(f"experiment={name}")
    assert isinstance(c, TrainConfig)
    validate(c)
    assert _recipe(c) == EXPECTED[name]
    assert c.run_name == name
    assert c.train.generations_per_prompt == 16
    # The precision group drives the trainer's LM head.
    assert c.model.fp32_lm_head is (c.precision.name == "fp32_head")
    # Paper App. A.3 / A.10 sizes.
    assert c.length.max_new_tokens == 14336
    if c.length.name == "interruption":
        assert (c.length.interruption_min, c.length.interruption_max, c.length.answer_budget) == (10240, 12288, 2048)
    else:
        assert (c.length.penalty_max_len, c.length.penalty_cache_len) == (14336, 2048)


def test_demo_is_a_cpu_scalerl_run():
    from scalerl_mega.config import validate

    c = _compose("experiment=demo")
    validate(c)
    assert (c.cluster.device, c.rollout.name, c.data.name) == ("cpu", "local", "synthetic")
    assert c.model.num_experts > 0 and c.model.arch == "llama4"
    assert (c.model.num_layers, c.model.hidden_size) == (4, 128)
    assert (c.train.prompts_per_step, c.train.generations_per_prompt) == (32, 8)
    assert c.optim.lr == pytest.approx(1e-4)
    assert c.sft.steps > 0
    assert (c.loss.name, c.aggregation.name, c.adv_norm.name, c.filter.name, c.curriculum.name) == (
        "cispo", "prompt", "batch", "zero_variance", "no_positive_resampling")
    assert c.off_policy.name == "pipeline_rl"


def test_group_override_on_command_line():
    c = _compose("experiment=scalerl", "loss=gspo", "off_policy.k=4")
    assert (c.loss.name, c.loss.eps_low, c.loss.eps_high, c.off_policy.k) == ("gspo", 0.003, 0.005, 4)


def test_schema_rejects_unknown_key():
    from hydra.errors import ConfigCompositionException as HydraCompositionError

    with pytest.raises(HydraCompositionError):
        _compose("train.not_a_key=1")


@pytest.mark.parametrize(
    ("path", "value", "key"),
    [
        (("loss", "name"), "ppo", "loss.name"),
        (("aggregation", "name"), "batch", "aggregation.name"),
        (("off_policy", "k"), 0, "off_policy.k"),
        (("train", "generations_per_prompt"), 1, "train.generations_per_prompt"),
        (("length", "interruption_min"), 13000, "length.interruption_min"),
        (("rollout", "top_p"), 1.5, "rollout.top_p"),
        (("curriculum", "pass_rate_threshold"), 0.0, "curriculum.pass_rate_threshold"),
        (("loss", "eps_high"), -1.0, "loss.eps_high"),
        (("train", "keep_checkpoints"), -1, "train.keep_checkpoints"),
    ],
)
def test_validate_names_the_key(path, value, key):
    from scalerl_mega.config import validate

    c = _compose("experiment=scalerl")
    section = getattr(c, path[0])
    setattr(c, path[0], dataclasses.replace(section, **{path[1]: value}))
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate(c)


def test_validate_rejects_head_precision_mismatch():
    from scalerl_mega.config import validate

    c = _compose("experiment=scalerl")
    c.model.fp32_lm_head = False
    with pytest.raises(ValueError, match=r"model\.fp32_lm_head"):
        validate(c)


def test_validate_rejects_grpo_asymmetric_clip():
    from scalerl_mega.config import validate

    c = _compose("experiment=deepseek_grpo", "loss.eps_high=0.28")
    with pytest.raises(ValueError, match=r"grpo clips symmetrically"):
        validate(c)


def test_cli_prints_resolved_config(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", "from scalerl_mega.train import main; main()", "--cfg", "job",
         "experiment=scalerl"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=True,
    ).stdout
    assert "name: cispo" in out and "name: pipeline_rl" in out and "run_name: scalerl" in out
    assert "fp32_lm_head: true" in out


# ---------------------------------------------------------------- checked before work starts (issue 16)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["sft.lr=0"], r"sft\.lr"),
        (["sft.lr=-1e-3"], r"sft\.lr"),
        (["sft.batch_size=0"], r"sft\.batch_size"),
        (["sft.warmup_steps=-1"], r"sft\.warmup_steps"),
        (["sft.eval_every=-5"], r"sft\.eval_every"),
        (["data.synthetic_num_prompts=300", "sft.batch_size=200"], r"sft\.batch_size=200 exceeds the 100 SFT"),
        (["data.val_prompts=20000"], r"data\.val_prompts=20000 must be < data\.synthetic_num_prompts=20000"),
        (["data.max_prompt_tokens=100"], r"data\.max_prompt_tokens \+ length\.max_new_tokens = 148 exceeds "
                                         r"model\.max_position_embeddings=128"),
        (["data.synthetic_difficulty_weights=[1,1]"], r"data\.synthetic_difficulty_weights=\[1\.0, 1\.0\] must be 3 "),
        (["data.synthetic_difficulty_weights=[0,0,0]"], r"data\.synthetic_difficulty_weights=.*positive sum"),
        (["data.synthetic_difficulty_weights=[1,-1,1]"], r"data\.synthetic_difficulty_weights=.*non-negative"),
    ],
)
def test_demo_settings_that_would_fail_later_fail_at_validation(overrides, key):
    from scalerl_mega.config import validate

    validate(_compose("experiment=demo"))  # the base passes
    with pytest.raises(ValueError, match=key):
        validate(_compose("experiment=demo", *overrides))


def test_sft_keys_unused_when_sft_is_off():
    from scalerl_mega.config import validate

    validate(_compose("experiment=demo", "sft.steps=0", "sft.lr=0"))


def test_device_request_this_machine_cannot_serve():
    import torch

    from scalerl_mega.config import validate_machine

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    c = _compose("experiment=demo", "cluster.device=cuda", f"cluster.devices_per_node={have + 1}")
    with pytest.raises(ValueError, match=r"cluster\.(device|devices_per_node)"):
        validate_machine(c)
    validate_machine(_compose("experiment=demo"))  # cpu: nothing to check
    validate_machine(_compose("experiment=scalerl"))  # slurm jobs run elsewhere


def test_broken_tokenizer_file_is_a_named_error(tmp_path):
    from scalerl_mega.config import validate_machine
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    good = tmp_path / "tok"
    build_arith_tokenizer().save_pretrained(str(good))
    c = _compose("experiment=demo", "data=polaris", f"data.tokenizer_path={good}", "data.train_files=[x.jsonl]")
    validate_machine(c)
    tj = good / "tokenizer.json"
    tj.write_text(tj.read_text()[: len(tj.read_text()) // 2])  # truncated
    with pytest.raises(ValueError, match=r"data\.tokenizer_path=.*not a loadable HF tokenizer"):
        validate_machine(c)
    tj.write_text('{"model": {"type": "BPE"}}')  # valid JSON, wrong content (KeyError-class failures)
    with pytest.raises(ValueError, match=r"data\.tokenizer_path=.*not a loadable HF tokenizer"):
        validate_machine(c)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["loss.is_correction=tis"], r"loss\.is_correction='tis' is not one of"),
        (["loss=dapo", "loss.is_correction=tis_token", "loss.is_cap=0"], r"loss\.is_cap=0\.0 must be > 0"),
        (["loss.is_correction=tis_seq"], r"loss\.is_correction='tis_seq' with loss\.name='cispo'"),
        (["loss.is_correction=mis_token", "loss.is_low=-0.5"], r"loss\.is_low=-0\.5 must be >= 0"),
        (["loss=grpo", "loss.is_correction=mis_seq", "loss.is_low=2", "loss.is_high=1.5"],
         r"loss\.is_high=1\.5 must be > loss\.is_low=2\.0"),
        (["metrics.mismatch_mode=fail"], r"metrics\.mismatch_mode='fail' is not one of"),
        (["metrics.max_logprob_mismatch=0"], r"metrics\.max_logprob_mismatch=0\.0 must be > 0"),
        (["rollout.top_p=0.9"], r"rollout\.top_p=0\.9 is refused: .*Use rollout\.top_p=1\.0"),
        (["rollout.engine_nice=20"], r"rollout\.engine_nice=20 must be in 0\.\.19"),
        (["moe.routing_replay=ids", "train.pack_sequences=true"], r"moe\.routing_replay='ids' with train\.pack_sequences=true"),
    ],
)
def test_consistency_settings_are_validated_with_the_key(overrides, key):
    from scalerl_mega.config import validate

    with pytest.raises(ValueError, match=key):
        validate(_compose("experiment=demo", *overrides))


def test_corrections_and_mismatch_guard_are_off_by_default_and_compose():
    from scalerl_mega.build import use_fused_cispo
    from scalerl_mega.config import validate

    for name in sorted(EXPECTED):
        c = _compose(f"experiment={name}")
        assert (c.loss.is_correction, c.metrics.max_logprob_mismatch) == ("none", None)
    c = _compose("experiment=demo")
    assert use_fused_cispo(c)
    for loss, mode in (("dapo", "tis_token"), ("gspo", "tis_seq"), ("grpo", "mis_token"), ("cispo", "mis_seq")):
        c = _compose("experiment=demo", f"loss={loss}", f"loss.is_correction={mode}", "metrics.max_logprob_mismatch=0.5",
                     "metrics.mismatch_mode=assert")
        validate(c)
        assert not use_fused_cispo(c)  # the masks need the trainer's log-probs: logits path


def test_sampling_temperature_reaches_the_trainer_and_turns_off_the_fused_head():
    from scalerl_mega.build import megatron_config, use_fused_cispo
    from scalerl_mega.config import validate

    c = _compose("experiment=demo", "rollout.temperature=0.7")
    validate(c)
    assert megatron_config(c).logit_temperature == 0.7 and not use_fused_cispo(c)
    c = _compose("experiment=demo")
    assert megatron_config(c).logit_temperature == 1.0 and use_fused_cispo(c)


def test_difficulty_weights_reach_the_task():
    """`data.synthetic_difficulty_weights=[0, 0, 1, 1]` with 4 digits: every operand of every train and held-out
    prompt has 3 or 4 digits (the built task's own prompts, counted here)."""
    from scalerl_mega.build import build_task

    c = _compose("experiment=demo", "data.synthetic_max_digits=4", "data.synthetic_num_prompts=400",
                 "data.val_prompts=50", "data.synthetic_difficulty_weights=[0,0,1,1]", "data.max_prompt_tokens=16",
                 "length.max_new_tokens=80", "length.interruption_min=68", "length.interruption_max=72")
    task = build_task(c)
    digits = {len(str(p.meta[k])) for p in task.train_prompts + task.val_prompts for k in ("a", "b")}
    assert digits == {3, 4} and len(task.val_prompts) == 50


@pytest.mark.parametrize("flattened", [False, True])
def test_weight_sync_settings_reach_the_engines(flattened):
    """`rollout.weight_sync_flattened` and `rollout.weight_sync_bucket_mb` become the engines' WeightSyncConfig
    (build.weight_sync_config: every engine builder takes it from there); the default stays one broadcast per
    tensor."""
    from scalerl_mega.build import weight_sync_config

    c = _compose("experiment=demo", f"rollout.weight_sync_flattened={flattened}", "rollout.weight_sync_bucket_mb=3")
    s = weight_sync_config(c, backend="gloo", group_name="g1")
    assert (s.flattened, s.bucket_bytes, s.backend, s.group_name) == (flattened, 3 * 2**20, "gloo", "g1")
    assert weight_sync_config(_compose("experiment=demo"), backend="nccl").flattened is False
