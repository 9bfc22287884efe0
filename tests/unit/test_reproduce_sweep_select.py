"""`python -m scalerl_mega.reproduce sweep --sweep ...`: the selected sweep's overlays and directory reach the
Hydra multirun, and every run finished by an invocation gets that invocation's provenance.json (issue 29
item 4). The multirun itself is replaced by a fake that finishes one point and leaves another unfinished;
the real skip-done/resume path is tests/integration/test_reproduce_sweep.py."""

from __future__ import annotations

import json
from pathlib import Path

import scalerl_mega.reproduce as rep
import scalerl_mega.reproduce_report as rep_report


def _log_steps(d: Path, first: int, last: int) -> None:
    with open(d / "metrics.jsonl", "a") as f:
        for step in range(first, last + 1):
            f.write(json.dumps({"kind": "train", "step": step, "loss": 0.1}) + "\n")
            if step % 2 == 0:
                f.write(json.dumps({"kind": "validation", "step": step, "val_pass_rate": 0.5}) + "\n")


def _fake_sweep(calls: list, finish: list[str], *, trained: dict[str, tuple[int, int]] | None = None):
    """A multirun that logs steps `trained[point] = (first, last)` into the points' metrics.jsonl, finishes
    the points in `finish` (800 steps), leaves repro3_no_npr/seed0 killed (no summary) and
    repro3_batch_large/seed0 preempted (SIGTERM summary) unless finished."""
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
        for point, summary in (("repro3_no_npr/seed0", None),                             # killed: no summary
                               ("repro3_batch_large/seed0", {"steps": 171, "preempted": True})):  # SIGTERM
            d = sweep_dir / point
            if (d / "summary.json").is_file() and point in finish:
                continue
            d.mkdir(parents=True, exist_ok=True)
            (d / "run_config.yaml").write_text("train:\n  steps: 400\n")
            if summary:
                (d / "summary.json").write_text(json.dumps(summary))
        return 0
    return call


def test_repro3_selects_its_overlays_and_stamps_finished_runs_once(tmp_path, monkeypatch):
    calls: list = []
    sweep = tmp_path / "sw"
    monkeypatch.setattr(rep, "_launch", _fake_sweep(calls, ["repro3_scalerl/seed0"]))
    monkeypatch.setattr(rep, "_git", lambda *a: "abc123" if a[0] == "rev-parse" else " M file.py")
    assert rep.main(["sweep", "--sweep", "repro3", "--sweep-dir", str(sweep), "--seeds", "0"]) == 0
    assert ("experiment=repro3_scalerl,repro3_batch_small,repro3_batch_large,repro3_batch_control,repro3_no_npr"
            in calls[0])
    first = json.loads((sweep / "repro3_scalerl" / "seed0" / "provenance.json").read_text())
    assert first["commit"] == "abc123" and first["dirty"] is True
    assert not (sweep / "repro3_no_npr" / "seed0" / "provenance.json").exists()
    assert not (sweep / "repro3_batch_large" / "seed0" / "provenance.json").exists()  # preempted: not finished

    # The second invocation (another commit) finishes the other point; the first keeps its own stamp.
    monkeypatch.setattr(rep, "_launch", _fake_sweep(calls, ["repro3_no_npr/seed0"]))
    monkeypatch.setattr(rep, "_git", lambda *a: "def456" if a[0] == "rev-parse" else "")
    assert rep.main(["sweep", "--sweep", "repro3", "--sweep-dir", str(sweep), "--seeds", "0"]) == 0
    assert json.loads((sweep / "repro3_scalerl" / "seed0" / "provenance.json").read_text())["commit"] == "abc123"
    second = json.loads((sweep / "repro3_no_npr" / "seed0" / "provenance.json").read_text())
    assert second["commit"] == "def456" and second["dirty"] is False
    assert [json.loads(x)["commit"] for x in (sweep / "provenance.jsonl").read_text().splitlines()] == [
        "abc123", "def456"]


def test_a_run_resumed_across_commits_records_which_commit_trained_which_steps(tmp_path, monkeypatch):
    """The first invocation (commit abc) trains scalerl/seed0 to step 300 and is stopped; the second (def)
    resumes it from its step-300 checkpoint after a SIGKILL that had logged up to 310, and finishes it."""
    calls: list = []
    sweep = tmp_path / "sw"
    monkeypatch.setattr(rep, "_launch", _fake_sweep(calls, [], trained={"repro3_scalerl/seed0": (1, 310)}))
    monkeypatch.setattr(rep, "_git", lambda *a: "abc" if a[0] == "rev-parse" else "")
    rep.main(["sweep", "--sweep", "repro3", "--sweep-dir", str(sweep), "--seeds", "0"])
    assert not (sweep / "repro3_scalerl" / "seed0" / "provenance.json").exists()
    monkeypatch.setattr(rep, "_launch", _fake_sweep(calls, ["repro3_scalerl/seed0"],
                                                   trained={"repro3_scalerl/seed0": (301, 800)}))
    monkeypatch.setattr(rep, "_git", lambda *a: "def" if a[0] == "rev-parse" else "")
    rep.main(["sweep", "--sweep", "repro3", "--sweep-dir", str(sweep), "--seeds", "0"])

    lines = [json.loads(x) for x in (sweep / "provenance.jsonl").read_text().splitlines()]
    assert [x["progress"] for x in lines] == [{"repro3_scalerl/seed0": [0, 310]}, {"repro3_scalerl/seed0": [310, 800]}]
    prov = json.loads((sweep / "repro3_scalerl" / "seed0" / "provenance.json").read_text())
    assert prov["commit"] == "def"
    assert [(s["commit"], s["steps"]) for s in prov["segments"]] == [("abc", [0, 310]), ("def", [310, 800])]
    assert [s["wall_s"] for s in prov["segments"]] == [x["wall_s"] for x in lines]  # each trained this run alone


def test_sigterm_to_the_sweep_process_is_forwarded_and_the_invocation_still_returns(tmp_path):
    """`kill <sweep pid>` (or SIGHUP) must not kill the recorder before the trainer: the child gets SIGTERM and
    `_launch` returns the child's own exit status once it has finished (its checkpoint, here a file)."""
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
        rc = rep._launch([sys.executable, "-c", child], dict(os.environ))
    finally:
        t.join()
    assert rc == 7 and done.read_text() == "checkpointed"
    assert signal.getsignal(signal.SIGTERM) is before


def test_default_sweep_is_the_leave_one_out_one(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rep, "_launch", _fake_sweep(calls, []))
    assert rep.main(["sweep", "--seeds", "0"]) == 0
    assert f"experiment={','.join(rep.RECIPE_RUN_NAMES)}" in calls[0]
    assert "hydra.sweep.dir=outputs/reproduce" in calls[0]


def test_repro6_fast_defaults_to_its_own_seeds_in_repro6s_directory(tmp_path, monkeypatch):
    """repro6_fast's runs are a fourth and fifth seed of repro6's recipe, started from repro6's warm start: without
    --seeds it runs seeds 3 and 4 (not repeats of repro6's 0-2) in outputs/reproduce6; --seeds still overrides."""
    calls: list = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rep, "_launch", _fake_sweep(calls, []))
    assert rep.main(["sweep", "--sweep", "repro6_fast"]) == 0
    assert "seed=3,4" in calls[0] and "experiment=repro6_fast" in calls[0]
    assert "hydra.sweep.dir=outputs/reproduce6" in calls[0] and "sft.checkpoint=outputs/reproduce6/sft" in calls[0]
    assert rep.main(["sweep", "--sweep", "repro6_fast", "--seeds", "5,6"]) == 0
    assert "seed=5,6" in calls[1]
    assert rep.main(["sweep", "--sweep", "repro6"]) == 0
    assert "seed=0,1,2" in calls[2]
    assert rep.main(["sweep", "--sweep", "repro6_twin"]) == 0
    assert "seed=5,6" in calls[3] and "experiment=repro6_twin" in calls[3]
    assert "hydra.sweep.dir=outputs/reproduce6" in calls[3] and "sft.checkpoint=outputs/reproduce6/sft" in calls[3]


def test_recipe_name_strips_either_prefix():
    assert rep_report.recipe_name("repro_dapo") == "dapo"
    assert rep_report.recipe_name("repro3_batch_small") == "batch_small"
    assert rep_report.recipe_name("repro5_scalerl") == rep_report.recipe_name("repro4_scalerl") == "scalerl"
    assert rep_report.recipe_name("demo") == "demo"


def test_concurrent_invocations_claim_only_their_own_points(tmp_path, monkeypatch):
    """Two pieces at a time: while invocation A (`--seeds 0 --recipes repro3_scalerl`) runs, another trains
    repro3_batch_small/seed0 in the same sweep directory (its steps appear in A's before/after snapshot). A's
    line and A's stamp name only A's point, with A's wall time; an old line (written before the fix) that also
    counted the other point is read the same way."""
    calls: list = []
    sweep = tmp_path / "sw"
    old = {"started": "t0", "commit": "old", "dirty": False, "wall_s": 50.0, "rc": 0,
           "command": "OMP_NUM_THREADS=1 python -m scalerl_mega.train -m seed=0 experiment=repro3_batch_small",
           "progress": {"repro3_batch_small/seed0": [0, 100], "repro3_scalerl/seed0": [0, 40]}}
    sweep.mkdir()
    (sweep / "provenance.jsonl").write_text(json.dumps(old) + "\n")
    monkeypatch.setattr(rep, "_launch", _fake_sweep(calls, ["repro3_scalerl/seed0"], trained={
        "repro3_scalerl/seed0": (1, 800), "repro3_batch_small/seed0": (101, 300)}))
    monkeypatch.setattr(rep, "_git", lambda *a: "abc" if a[0] == "rev-parse" else "")
    rep.main(["sweep", "--sweep", "repro3", "--sweep-dir", str(sweep), "--seeds", "0", "--recipes", "repro3_scalerl"])
    line = json.loads((sweep / "provenance.jsonl").read_text().splitlines()[-1])
    assert line["progress"] == {"repro3_scalerl/seed0": [0, 800]}
    prov = json.loads((sweep / "repro3_scalerl" / "seed0" / "provenance.json").read_text())
    assert [(s["commit"], s["steps"], s["wall_s"]) for s in prov["segments"]] == [("abc", [0, 800], line["wall_s"])]
    assert rep.points_of_command(old["command"]) == {"repro3_batch_small/seed0"}
    assert rep.points_of_command("python -m scalerl_mega.train -m seed=0,1 experiment=a,b") == {
        "a/seed0", "a/seed1", "b/seed0", "b/seed1"}
    assert rep.points_of_command("a hand-written note") is None  # then the recorded progress is taken as it is
