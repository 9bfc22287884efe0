"""`python -m reproduction.reproduce sweep --design ...` (reproduction/sweeps.py): the design's overlays and directory
reach the Hydra multirun, and every run finished by an invocation gets that invocation's provenance.json. The
multirun itself is replaced by a fake that finishes one point and leaves another unfinished; the real
skip-done/resume path is tests/integration/test_reproduce_sweep.py."""

from __future__ import annotations

import json
from pathlib import Path

import reproduction.reproduce as cli
import reproduction.sweeps as rep
from reproduction.common import recipe_name


def _log_steps(d: Path, first: int, last: int) -> None:
    with open(d / "metrics.jsonl", "a") as f:
        for step in range(first, last + 1):
            f.write(json.dumps({"kind": "train", "step": step, "loss": 0.1}) + "\n")
            if step % 2 == 0:
                f.write(json.dumps({"kind": "validation", "step": step, "val_pass_rate": 0.5}) + "\n")


def _fake_sweep(calls: list, finish: list[str], *, trained: dict[str, tuple[int, int]] | None = None):
    """A multirun that logs steps `trained[point] = (first, last)` into the points' metrics.jsonl, finishes
    the points in `finish` (800 steps), leaves loo_no_npr/seed0 killed (no summary) and
    loo_dapo/seed0 preempted (SIGTERM summary) unless finished."""
    def call(cmd, env=None):
        calls.append(cmd)
        sweep_dir = Path(next(a for a in cmd if a.startswith("hydra.sweep.dir=")).split("=", 1)[1])
        for point, (first, last) in (trained or {}).items():
            (sweep_dir / point).mkdir(parents=True, exist_ok=True)
            _log_steps(sweep_dir / point, first, last)
        for point in finish:
            d = sweep_dir / point
            d.mkdir(parents=True, exist_ok=True)
            (d / "summary.json").write_text(json.dumps({"steps": 800}))
            (d / "run_config.yaml").write_text("train:\n  steps: 800\n")
        for point, summary in (("loo_no_npr/seed0", None),                             # killed: no summary
                               ("loo_dapo/seed0", {"steps": 171, "preempted": True})):  # SIGTERM
            d = sweep_dir / point
            if (d / "summary.json").is_file() and point in finish:
                continue
            d.mkdir(parents=True, exist_ok=True)
            (d / "run_config.yaml").write_text("train:\n  steps: 400\n")
            if summary:
                (d / "summary.json").write_text(json.dumps(summary))
        return 0
    return call


def test_the_design_selects_its_overlays_and_stamps_finished_runs_once(tmp_path, monkeypatch):
    calls: list = []
    sweep = tmp_path / "sw"
    monkeypatch.setattr(rep, "launch", _fake_sweep(calls, ["loo_scalerl/seed0"]))
    monkeypatch.setattr(rep, "git_state", lambda cwd=None: {"commit": "abc123", "dirty": True})
    assert cli.main(["sweep", "--design", "loo", "--sweep-dir", str(sweep), "--seeds", "0"]) == 0
    assert ("experiment=reproduction/loo_scalerl,reproduction/loo_dapo,reproduction/loo_no_zvf,"
            "reproduction/loo_no_fp32_head,reproduction/loo_no_npr" in calls[0])
    first = json.loads((sweep / "loo_scalerl" / "seed0" / "provenance.json").read_text())
    assert first["commit"] == "abc123" and first["dirty"] is True
    assert not (sweep / "loo_no_npr" / "seed0" / "provenance.json").exists()
    assert not (sweep / "loo_dapo" / "seed0" / "provenance.json").exists()  # preempted: not finished

    # The second invocation (another commit) finishes the other point; the first keeps its own stamp.
    monkeypatch.setattr(rep, "launch", _fake_sweep(calls, ["loo_no_npr/seed0"]))
    monkeypatch.setattr(rep, "git_state", lambda cwd=None: {"commit": "def456", "dirty": False})
    assert cli.main(["sweep", "--design", "loo", "--sweep-dir", str(sweep), "--seeds", "0"]) == 0
    assert json.loads((sweep / "loo_scalerl" / "seed0" / "provenance.json").read_text())["commit"] == "abc123"
    second = json.loads((sweep / "loo_no_npr" / "seed0" / "provenance.json").read_text())
    assert second["commit"] == "def456" and second["dirty"] is False
    assert [json.loads(x)["commit"] for x in (sweep / "provenance.jsonl").read_text().splitlines()] == [
        "abc123", "def456"]


def test_a_run_resumed_across_commits_records_which_commit_trained_which_steps(tmp_path, monkeypatch):
    """The first invocation (commit abc) trains scalerl/seed0 to step 300 and is stopped; the second (def)
    resumes it from its step-300 checkpoint after a SIGKILL that had logged up to 310, and finishes it."""
    calls: list = []
    sweep = tmp_path / "sw"
    monkeypatch.setattr(rep, "launch", _fake_sweep(calls, [], trained={"loo_scalerl/seed0": (1, 310)}))
    monkeypatch.setattr(rep, "git_state", lambda cwd=None: {"commit": "abc", "dirty": False})
    cli.main(["sweep", "--design", "loo", "--sweep-dir", str(sweep), "--seeds", "0"])
    assert not (sweep / "loo_scalerl" / "seed0" / "provenance.json").exists()
    monkeypatch.setattr(rep, "launch", _fake_sweep(calls, ["loo_scalerl/seed0"],
                                                   trained={"loo_scalerl/seed0": (301, 800)}))
    monkeypatch.setattr(rep, "git_state", lambda cwd=None: {"commit": "def", "dirty": False})
    cli.main(["sweep", "--design", "loo", "--sweep-dir", str(sweep), "--seeds", "0"])

    lines = [json.loads(x) for x in (sweep / "provenance.jsonl").read_text().splitlines()]
    assert [x["progress"] for x in lines] == [{"loo_scalerl/seed0": [0, 310]}, {"loo_scalerl/seed0": [310, 800]}]
    prov = json.loads((sweep / "loo_scalerl" / "seed0" / "provenance.json").read_text())
    assert prov["commit"] == "def"
    assert [(s["commit"], s["steps"]) for s in prov["segments"]] == [("abc", [0, 310]), ("def", [310, 800])]
    assert [s["wall_s"] for s in prov["segments"]] == [x["wall_s"] for x in lines]  # each trained this run alone


def test_sigterm_to_the_sweep_process_is_forwarded_and_the_invocation_still_returns(tmp_path):
    """`kill <sweep pid>` (or SIGHUP) must not kill the recorder before the trainer: the child gets SIGTERM and
    `launch` returns the child's own exit status once it has finished (its checkpoint, here a file)."""
    import os
    import signal
    import sys
    import threading

    ready, done = tmp_path / "ready", tmp_path / "done"
    child = (
        "import signal, sys, time, pathlib\n"
        "got = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: got.append(1))\n"
        f"pathlib.Path({str(ready)!r}).write_text('x')\n"
        "while not got: time.sleep(0.01)\n"
        f"pathlib.Path({str(done)!r}).write_text('checkpointed')\n"
        "sys.exit(7)\n"
    )

    def signal_parent():
        while not ready.exists():  # forced order: the child's handler is installed before the signal
            threading.Event().wait(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=signal_parent)
    t.start()
    try:
        rc = rep.launch([sys.executable, "-c", child], dict(os.environ))
    finally:
        t.join()
    assert rc == 7 and done.read_text() == "checkpointed"
    assert signal.getsignal(signal.SIGTERM) is before


def test_default_design_is_predictability_and_each_design_has_its_directory(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rep, "launch", _fake_sweep(calls, []))
    assert cli.main(["sweep", "--seeds", "0"]) == 0
    assert "experiment=reproduction/predictability" in calls[0] and "seed=0" in calls[0]
    assert "hydra.sweep.dir=outputs/reproduction/predictability" in calls[0]
    assert "sft.checkpoint=outputs/reproduction/predictability/sft" in calls[0]
    assert cli.main(["sweep", "--design", "loo", "train.steps=3"]) == 0
    assert "seed=0,1,2" in calls[1] and "hydra.sweep.dir=outputs/reproduction/loo" in calls[1]
    assert calls[1][-1] == "train.steps=3"


def test_recipe_name_strips_the_design_and_iteration_prefixes():
    assert recipe_name("loo_dapo") == "dapo"
    assert recipe_name("predictability") == "scalerl"
    assert recipe_name("repro3_batch_small") == "batch_small"
    assert recipe_name("repro5_scalerl") == recipe_name("repro_scalerl") == "scalerl"
    assert recipe_name("demo") == "demo"


def test_concurrent_invocations_claim_only_their_own_points(tmp_path, monkeypatch):
    """Two pieces at a time: while invocation A (`--seeds 0`, loo_scalerl only) runs, another trains
    loo_no_zvf/seed0 in the same sweep directory (its steps appear in A's before/after snapshot). A's
    line and A's stamp name only A's point, with A's wall time; an old line (written before the fix) that also
    counted the other point is read the same way."""
    calls: list = []
    sweep = tmp_path / "sw"
    old = {"started": "t0", "commit": "old", "dirty": False, "wall_s": 50.0, "rc": 0,
           "command": "OMP_NUM_THREADS=1 python -m scalerl_mega.train -m seed=0 experiment=loo_no_zvf",
           "progress": {"loo_no_zvf/seed0": [0, 100], "loo_scalerl/seed0": [0, 40]}}
    sweep.mkdir()
    (sweep / "provenance.jsonl").write_text(json.dumps(old) + "\n")
    monkeypatch.setattr(rep, "launch", _fake_sweep(calls, ["loo_scalerl/seed0"], trained={
        "loo_scalerl/seed0": (1, 800), "loo_no_zvf/seed0": (101, 300)}))
    monkeypatch.setattr(rep, "git_state", lambda cwd=None: {"commit": "abc", "dirty": False})
    rep.run_sweep(sweep_dir=sweep, overlays=["loo_scalerl"], seeds="0", overrides=[])
    line = json.loads((sweep / "provenance.jsonl").read_text().splitlines()[-1])
    assert line["progress"] == {"loo_scalerl/seed0": [0, 800]}
    prov = json.loads((sweep / "loo_scalerl" / "seed0" / "provenance.json").read_text())
    assert [(s["commit"], s["steps"], s["wall_s"]) for s in prov["segments"]] == [("abc", [0, 800], line["wall_s"])]
    assert rep.points_of_command(old["command"]) == {"loo_no_zvf/seed0"}
    assert rep.points_of_command("python -m scalerl_mega.train -m seed=0,1 experiment=reproduction/a,b") == {
        "a/seed0", "a/seed1", "b/seed0", "b/seed1"}
    assert rep.points_of_command("a hand-written note") is None  # then the recorded progress is taken as it is
