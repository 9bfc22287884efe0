"""A tiny checkpoint records what it is for (scalerl_mega/model/tiny_run.py): `tools/make_tiny_checkpoint.py` writes the
overrides that run it on the synthetic task on CPU beside it, and `scalerl-train experiment=qwen3
init_from_hf=DIR` composes with them, the command line's own keys (and the groups it chooses) winning. The slow
test runs that command as it stands and checks the RL steps trained samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl_mega.model.tiny_run import CPU_RUN, RUN_FILE, recorded_overrides, with_recorded, write_run_file

REPO = Path(__file__).resolve().parents[2]


def _run_dir(tmp_path: Path) -> Path:
    write_run_file(tmp_path, arch="qwen3", preset="tiny_qwen3")
    return tmp_path


def test_recorded_overrides_leave_the_command_lines_keys_and_groups(tmp_path):
    d = _run_dir(tmp_path)
    assert json.loads((d / RUN_FILE).read_text())["overrides"] == list(CPU_RUN)
    got = recorded_overrides(["experiment=qwen3", f"init_from_hf={d}", "train.steps=3", "rollout=sglang",
                              "+sft.steps=5"])
    assert "train.steps=20" not in got and "sft.steps=300" not in got  # set by the command line
    assert "rollout=local" not in got and "rollout.engine_threads=1" not in got  # its group chosen there
    assert got == [o for o in CPU_RUN if o.split("=")[0] not in
                   ("train.steps", "sft.steps", "rollout", "rollout.engine_threads")]
    assert recorded_overrides(["experiment=qwen3", "init_from_hf=/nonexistent"]) == []
    assert recorded_overrides(["experiment=demo"]) == []


def test_with_recorded_puts_them_before_the_first_override(tmp_path):
    d = _run_dir(tmp_path)
    argv, added = with_recorded(["--validate", "experiment=qwen3", f"init_from_hf={d}", "train.steps=3"])
    assert argv == ["--validate", *added, "experiment=qwen3", f"init_from_hf={d}", "train.steps=3"]
    (d / RUN_FILE).write_text("not json")
    with pytest.raises(ValueError, match=f"{RUN_FILE}: not a tiny checkpoint's run file"):
        with_recorded([f"init_from_hf={d}"])


@pytest.mark.parametrize("exp", ["qwen3", "qwen3_moe"])
def test_the_qwen3_experiments_compose_for_cpu_from_a_tiny_checkpoint(tmp_path, exp):
    from scalerl_mega.compose import compose

    arch = exp
    r = subprocess.run([sys.executable, "tools/make_tiny_checkpoint.py", arch, str(tmp_path / "ckpt")], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    cfg = compose([f"experiment={exp}", f"init_from_hf={tmp_path / 'ckpt'}", "train.steps=3"])
    assert (cfg.run_name, cfg.model.name, cfg.model.arch, cfg.data.name) == (exp, "hf", arch, "synthetic")
    assert (cfg.rollout.name, cfg.cluster.name, cfg.cluster.device) == ("local", "local", "cpu")
    # docs/extending.md: 2-digit sums, 8 prompts x 8 samples, a 300-step SFT warm start
    assert (cfg.train.steps, cfg.train.prompts_per_step, cfg.train.generations_per_prompt) == (3, 8, 8)
    assert (cfg.data.synthetic_max_digits, cfg.sft.steps) == (2, 300)
    assert (cfg.loss.name, cfg.filter.name) == ("cispo", "zero_variance")  # the experiment's recipe stays


@pytest.mark.slow
def test_a_tiny_qwen3_run_as_documented_trains_its_rl_steps(tmp_path):
    """`make_tiny_checkpoint.py qwen3 DIR` then `scalerl-train experiment=qwen3 init_from_hf=DIR train.steps=3`, no
    other override: the SFT warm start gives samples that differ, so the filter keeps prompts and every RL step
    trains (loss computed on kept samples), and no step is reported as having trained nothing."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "run"
    r = subprocess.run([sys.executable, "tools/make_tiny_checkpoint.py", "qwen3", str(ckpt)], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(REPO / ".venv" / "bin" / "scalerl-train"), "experiment=qwen3", f"init_from_hf={ckpt}",
                          "train.steps=3", f"output_dir={out}", f"hydra.run.dir={out}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=3000)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "init_from_hf is a tiny checkpoint for the synthetic task on CPU" in run.stdout
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if r.get("kind") == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for rec in train:
        assert not rec.get("skipped_no_signal") and rec["batch_samples"] > 0 and rec["batch_prompts"] > 0, rec
    rewards = [rec["reward_mean"] for rec in train]
    assert all(-1.0 < x < 1.0 for x in rewards), rewards  # mixed outcomes: neither all wrong nor all right
    assert "nothing trained" not in run.stdout + run.stderr
    assert "trained nothing" not in (out / "report.md").read_text()
