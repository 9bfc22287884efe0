"""Ctrl-C and resume of a LoRA run (`peft=lora`, base from `init_from_hf`): the SIGINT (sent by the signal driver's
hook after RL step 2, tests/faults/signal_driver.py) makes the run save an adapter-only checkpoint and exit 130; the
rerun of the same command resumes there and finishes. The trained prompt sequence of the two launches equals an
uninterrupted run's (the same oracle as the full-training kill test, tests/integration/test_resume_kill.py: the
samples themselves depend on the engine's timing, so adapter values are not compared across runs), the checkpoint
holds the adapters and their Adam moments only (every tensor named and shaped by hand from the base's config.json,
no base weight), and after the resume every step's push sends the adapters alone (`sync/bytes` = the PEFT export's
bytes, counted by hand) to a fresh engine whose log-probs match the trainer's restored policy.

A tiny random Qwen3 (`tools/make_tiny_checkpoint.py qwen3`) is the base; the reward is shaped by completion length
(`reward=custom_example`, `length_penalty`) so that the groups' rewards differ and the adapters move (the random
model solves no sum, and the default +-1 reward would give zero advantages and untouched adapters), at a learning
rate (1e-2) at which one adapter step moves the log-probs far above the trainer/engine agreement bound."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.faults.test_sigint import DRIVER, REPO, _group_left, run_in_session
from tests.faults.test_sigterm import _train_steps

pytestmark = pytest.mark.slow  # three launches of ~45 s each on a loaded 2-core machine

RANK = 8  # conf/peft/lora.yaml's default rank
RUN = [
    "experiment=qwen3", "peft=lora", "optim.lr=1e-2", "reward=custom_example", "reward.custom.length_penalty=1.0", "sft.steps=0",
    "filter=none", "train.steps=4", "data.synthetic_num_prompts=400", "data.val_prompts=8", "data.val_samples=2",
    "train.prompts_per_step=4", "train.generations_per_prompt=4", "train.val_every=0", "train.save_every=0",
    "rollout.max_batch_size=4", "length.max_new_tokens=24", "length.interruption_min=12",
    "length.interruption_max=16", "length.answer_budget=4", "metrics.tensorboard=false",
]


def _launch(out: Path, base: Path, *, log: Path, interrupt: bool) -> tuple[int, str, int]:
    """`scalerl-train RUN init_from_hf=base` in a session of its own, through the driver (SIGINT to the process
    group once, after RL step 2) when `interrupt`; returns (exit status, console, process group id)."""
    head = [sys.executable, str(DRIVER), "rl", "2", "INT", "1"] if interrupt else [sys.executable, "-m",
                                                                                    "scalerl_mega.train"]
    return run_in_session([*head, *RUN, f"init_from_hf={base}", f"output_dir={out}", f"hydra.run.dir={out}"], log=log)


def _train_records(out: Path) -> list[dict]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["kind"] == "train"]


def _linears(hf: dict) -> dict[str, tuple[int, int]]:
    """Megatron's adapted linears of one layer -> (in, out), from an HF Qwen3 config (q/k/v fused, gate/up fused)."""
    h, hd, ffn = hf["hidden_size"], hf["head_dim"], hf["intermediate_size"]
    q, kv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
    return {"self_attention.linear_qkv": (h, q + 2 * kv), "self_attention.linear_proj": (q, h),
            "mlp.linear_fc1": (h, 2 * ffn), "mlp.linear_fc2": (ffn, h)}


def _expected_checkpoint(hf: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor an adapter-only checkpoint holds: A [r, in] and B [out, r] per adapted linear and layer, and
    AdamW's two moments of each."""
    adapters = {}
    for layer in range(hf["num_hidden_layers"]):
        for name, (n_in, n_out) in _linears(hf).items():
            stem = f"adapters.decoder.layers.{layer}.{name}.weight"
            adapters[f"{stem}.lora_A"] = (RANK, n_in)
            adapters[f"{stem}.lora_B"] = (n_out, RANK)
    moments = {f"optimizer.state.{m}.{k}": s for k, s in adapters.items() for m in ("exp_avg", "exp_avg_sq")}
    return {**adapters, **moments}


def _peft_bytes(hf: dict) -> int:
    """FP32 bytes of the PEFT export one push sends: r (in + out) per HF projection and layer (q/k/v and gate/up
    each carry their own copy of the fused linear's A)."""
    h, hd, ffn = hf["hidden_size"], hf["head_dim"], hf["intermediate_size"]
    q, kv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
    per_layer = sum(RANK * (n_in + n_out) for n_in, n_out in
                    ((h, q), (h, kv), (h, kv), (q, h), (h, ffn), (h, ffn), (ffn, h)))
    return 4 * per_layer * hf["num_hidden_layers"]


def _read_checkpoint(step_dir: Path) -> dict:
    """The tensors of a Megatron torch_dist checkpoint directory, read without a process group."""
    import torch
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(step_dir))
    meta = reader.read_metadata().state_dict_metadata
    state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in meta.items() if hasattr(v, "size")}
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state


@pytest.mark.timeout(1800)
def test_ctrl_c_saves_adapters_only_and_the_rerun_resumes_the_same_prompt_sequence(tmp_path):
    base = tmp_path / "base"
    made = subprocess.run([sys.executable, "tools/make_tiny_checkpoint.py", "qwen3", str(base)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    hf = json.loads((base / "config.json").read_text())

    rc, text, _ = _launch(tmp_path / "full", base, log=tmp_path / "full.log", interrupt=False)
    assert rc == 0, text[-3000:]
    expected = [r["prompt_ids"] for r in _train_records(tmp_path / "full")]
    assert len(expected) == 4 and len({p for ids in expected for p in ids}) == 16

    part = tmp_path / "part"
    rc, text, pgid = _launch(part, base, log=tmp_path / "first.log", interrupt=True)
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "interrupted: checkpoint saved at step 2; rerun the same command to resume" in text
    assert _train_steps(part) == [1, 2] and not _group_left(pgid)

    saved = _read_checkpoint(part / "checkpoints" / "step_00000002")
    assert {k: tuple(t.shape) for k, t in saved.items()} == _expected_checkpoint(hf)  # no base weight
    assert all(float(t.abs().max()) > 0 for k, t in saved.items() if k.startswith("adapters.") and
               k.endswith(".lora_B"))  # B starts at zero: two steps moved every adapter

    rc, text, pgid = _launch(part, base, log=tmp_path / "rerun.log", interrupt=False)
    assert rc == 0, text[-3000:]
    assert "resumed from" in text and "at step 2" in text, text[-3000:]
    assert not _group_left(pgid)
    records = _train_records(part)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["prompt_ids"] for r in records] == expected
    assert [r["sync/bytes"] for r in records[2:]] == [_peft_bytes(hf)] * 2  # the adapters alone, each step
    # the resumed run's first samples come from its fresh engine after the push of the checkpoint's adapters
    # (version 2): their log-probs equal the restored trainer's (FP32) ...
    first = records[2]
    assert first["staleness_mean"] == 0 and first["train/onpolicy_tokens"] > 0, first
    assert first["train/onpolicy_abs_log_ratio_max"] <= 1e-5, first
    # ... while one adapter step moves them by far more (stale tokens' mean |log ratio| at steps trained one
    # version after their samples): an engine serving other adapters (none: the base alone) could not agree so closely
    moved = [r["train/abs_log_ratio_mean"] for r in records if r["staleness_mean"] > 0]
    assert moved and min(moved) > 1e-3, moved
