"""Every experiment overlay composes with Hydra's compose API, validates, and maps the paper's recipe."""

from __future__ import annotations

import dataclasses
import re
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
    # ScaleRL on Qwen3 dense / MoE: the recipe unchanged, only the model
    "qwen3": SCALERL,
    "qwen3_moe": SCALERL,
    "minimax": ("cispo", None, 5.0, "prompt", "prompt", "ppo_off_policy", 8, "interruption",
                "uniform", "zero_variance", "fp32_head", 80),
}


# The reproduction's leave-one-out design (conf/experiment/reproduction/loo_*.yaml): the demo's recipe with one axis
# reverted each.
DEMO = ("cispo", None, 5.0, "prompt", "batch", "pipeline_rl", 2, "interruption", "no_positive_resampling",
        "zero_variance", "fp32_head", 32)
REPRO = {
    "loo_scalerl": DEMO,
    "loo_dapo": ("dapo", 0.2, 0.26) + DEMO[3:],
    "loo_no_zvf": DEMO[:9] + ("none",) + DEMO[10:],
    "loo_no_fp32_head": DEMO[:10] + ("bf16_head", 32),
    "loo_no_npr": DEMO[:8] + ("uniform",) + DEMO[9:],
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
    assert on_disk == set(EXPECTED) | {"demo", "demo_multiturn", "demo_lora", "smollm2_cpu", "smollm2_python_tool",
                                       "gpu_check"}
    research = {p.stem for p in (CONF / "experiment" / "reproduction").glob("*.yaml")}
    assert research == set(REPRO) | {"predictability"}
    assert not list((CONF / "experiment").glob("*/*/*.yaml"))  # one folder deep, no chains of iterations


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


def test_weight_sync_senders_key_is_checked_naming_it():
    """rollout.weight_sync_senders: single by default; per_stage with local engine processes (one or several) and
    SGLang, refused with the in-process engine; an unknown value is refused naming the key and the value."""
    from scalerl_mega.config import validate

    assert _compose("experiment=demo").rollout.weight_sync_senders == "single"
    validate(_compose("experiment=demo", "rollout.weight_sync_senders=per_stage"))
    with pytest.raises(ValueError, match=r"rollout.weight_sync_senders='per_expert' is not one of"):
        validate(_compose("experiment=demo", "rollout.weight_sync_senders=per_expert"))
    for fine in ("rollout.num_engines=2", "rollout=sglang"):  # several engines, SGLang servers: each joins every group
        validate(_compose("experiment=demo", "rollout.weight_sync_senders=per_stage", fine))
    with pytest.raises(ValueError, match=r"rollout.weight_sync_senders=per_stage needs rollout.in_process=false"):
        validate(_compose("experiment=demo", "rollout.weight_sync_senders=per_stage", "rollout.in_process=true"))


def test_the_predictability_design_is_one_overlay_on_the_demo():
    """conf/experiment/reproduction/predictability.yaml: 6,400 steps (321 window points) over 204,800 training
    prompts, each drawn once; a warm start on the first 102,400 of them, shared by the seeds; validated. (That it
    is the configuration of the committed runs: tests/unit/test_reproduction.py.)"""
    from scalerl_mega.config import validate

    text = (CONF / "experiment" / "reproduction" / "predictability.yaml").read_text()
    assert "- /experiment/demo" in text and text.count("  - ") == 1  # its only default is the demo
    c = _compose("experiment=reproduction/predictability")
    validate(c)
    assert c.run_name == "predictability" and c.train.steps == 6400 and c.train.steps // c.train.val_every + 1 == 321
    assert c.data.synthetic_num_prompts - c.data.val_prompts == c.train.steps * c.train.prompts_per_step == 204_800
    assert c.sft.synthetic_num_prompts == 102_600 and c.sft.any_seed
    assert c.sft.checkpoint == "outputs/reproduction/predictability/sft"
    assert _recipe(c) == DEMO


@pytest.mark.parametrize("name", sorted(REPRO))
def test_reproduce_overlays_revert_one_axis_of_the_demo(name):
    """Same sizes as each other (only the recipe differs), FP32 body, one shared warm start per seed."""
    from scalerl_mega.config import validate
    from scalerl_mega.train import sft_fingerprint

    c = _compose(f"experiment=reproduction/{name}", "seed=2")
    validate(c)
    assert _recipe(c) == REPRO[name] and c.run_name == name
    assert (c.train.steps, c.train.val_every, c.data.val_prompts, c.data.val_samples, c.sft.steps) == (50, 5, 100, 4, 250)
    assert c.precision.params_dtype == "float32"
    assert c.sft.checkpoint == "outputs/reproduction/loo/sft" and c.sft.any_seed
    assert sft_fingerprint(c) == sft_fingerprint(_compose("experiment=reproduction/loo_scalerl", "seed=2"))


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
        capture_output=True, text=True, timeout=600, cwd=tmp_path, check=True,
    ).stdout
    assert "name: cispo" in out and "name: pipeline_rl" in out and "run_name: scalerl" in out
    assert "fp32_lm_head: true" in out


# ---------------------------------------------------------------- checked before work starts


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
