"""Everything of a run goes under its output directory: with `output_dir=X`, Hydra's train.log and `.hydra/` go to
X as well (before, they went to `outputs/<run_name>/seed<N>/`, where a later run appended to another run's
train.log and overwrote its `.hydra/overrides.yaml`); nothing lands in the working directory; `--validate` writes
nothing at all; messages that point at the log name its real path."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from scalerl_mega.config.output_dir import follow_output_dir, in_log_file, override_value

REPO = Path(__file__).resolve().parents[2]


def test_output_dir_sets_hydras_run_dir_too():
    assert follow_output_dir(["experiment=demo", "output_dir=/r/x"]) == ["experiment=demo", "output_dir=/r/x",
                                                                         "hydra.run.dir=/r/x"]
    assert follow_output_dir(["++output_dir='/r/a b'"]) == ["++output_dir='/r/a b'", "hydra.run.dir='/r/a b'"]
    assert follow_output_dir(["output_dir=r/x", "hydra.run.dir=./r/x"]) == ["output_dir=r/x", "hydra.run.dir=./r/x"]
    assert follow_output_dir(["experiment=demo"]) == ["experiment=demo"]  # the default: both are the run dir
    assert follow_output_dir(["-m", "output_dir=/r/x", "seed=0,1"]) == ["-m", "output_dir=/r/x", "seed=0,1"]
    with pytest.raises(ValueError, match=r"^output_dir=/r/x and hydra.run.dir=/r/y name different folders: the "
                                         r"run's train.log and .hydra/ would go to /r/y"):
        follow_output_dir(["output_dir=/r/x", "hydra.run.dir=/r/y"])
    assert override_value(["output_dir=a", "seed=1", "+output_dir=b"], "output_dir") == "b"  # the last one wins


def test_a_message_pointing_at_the_log_names_its_path(tmp_path):
    root = logging.getLogger()
    handler = logging.FileHandler(tmp_path / "train.log")
    saved = root.handlers[:]
    root.handlers = [logging.StreamHandler()]
    try:
        assert in_log_file() == "logged above"
        root.addHandler(handler)
        assert in_log_file() == f"logged above and in {tmp_path / 'train.log'}"
    finally:
        root.handlers = saved
        handler.close()


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from scalerl_mega.train import main; main()", *args],
                          capture_output=True, text=True, timeout=600, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(cwd)})


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


HYDRA_FILES = {"train.log", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"}


def test_two_runs_with_their_own_output_dirs_share_nothing_and_leave_the_cwd_empty(tmp_path):
    """Runs refused inside the job (a negative learning rate: checked after Hydra made the run's folder) are the
    cheapest launches that write Hydra's files; each one's are under its own output_dir."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name, lr in (("a", "-1"), ("b", "-2")):
        r = _cli(cwd, "experiment=demo", f"optim.lr={lr}", f"output_dir={tmp_path / name}")
        assert r.returncode == 2 and r.stderr.strip() == f"config error: optim.lr={float(lr)} must be > 0", r.stderr
    assert _files(cwd) == set()
    for name, lr in (("a", "-1"), ("b", "-2")):
        assert _files(tmp_path / name) == HYDRA_FILES
        assert f"optim.lr={lr}" in (tmp_path / name / ".hydra" / "overrides.yaml").read_text()
    # the default output dir: outputs/<run_name>/seed<seed> of the working directory holds both
    r = _cli(cwd, "experiment=demo", "optim.lr=-3", "seed=4")
    assert r.returncode == 2
    assert _files(cwd) == {f"outputs/demo/seed4/{f}" for f in HYDRA_FILES}


def test_validate_writes_nothing_and_checks_the_runs_own_folder(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    ok = _cli(cwd, "--validate", "experiment=demo", "seed=2")
    assert ok.returncode == 0 and ok.stdout.strip().endswith("output_dir=outputs/demo/seed2"), ok.stderr[-2000:]
    ok = _cli(cwd, "--validate", "experiment=demo", f"output_dir={tmp_path / 'x'}")
    assert ok.returncode == 0 and ok.stdout.strip().endswith(f"output_dir={tmp_path / 'x'}"), ok.stderr[-2000:]
    assert _files(tmp_path) == set()
    bad = _cli(cwd, "--validate", "experiment=demo", f"output_dir={tmp_path / 'x'}", f"hydra.run.dir={tmp_path}")
    assert bad.returncode == 2 and bad.stderr.startswith(f"config error: output_dir={tmp_path / 'x'} and "
                                                         f"hydra.run.dir={tmp_path} name different folders")


TINY = ["experiment=demo", "sft.steps=0", "data.synthetic_num_prompts=400", "data.val_prompts=8",
        "train.prompts_per_step=4", "train.generations_per_prompt=4", "train.val_every=0", "train.save_every=1",
        "rollout.max_batch_size=4", "length.max_new_tokens=24", "length.interruption_min=12",
        "length.interruption_max=16", "length.answer_budget=4", "train.steps=1"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_training_run_keeps_every_file_under_output_dir(tmp_path):
    """A real (one-step) run: its log with the progress lines, `.hydra/`, checkpoint, metrics, TensorBoard events
    and report are all under output_dir; the working directory stays empty; a second run elsewhere adds nothing to
    the first's folder."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    first, second = tmp_path / "first", tmp_path / "second"
    r = _cli(cwd, *TINY, f"output_dir={first}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = _files(first)
    assert HYDRA_FILES | {"report.md", "summary.json", "metrics.jsonl", "run_config.yaml"} <= files, sorted(files)
    assert any(f.startswith("checkpoints/") for f in files) and any(f.startswith("tensorboard/") for f in files)
    assert "step 1/1" in (first / "train.log").read_text()
    assert _files(cwd) == set()
    before = {f: (first / f).read_bytes() for f in files}
    r = _cli(cwd, *TINY, "seed=1", f"output_dir={second}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert {f: (first / f).read_bytes() for f in _files(first)} == before
    assert "seed=1" in (second / ".hydra" / "overrides.yaml").read_text() and _files(cwd) == set()
