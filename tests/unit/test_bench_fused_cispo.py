"""bench/fused_cispo.py's driver: its workers import the package from any directory, and a failed variant
fails the run (the first GPU session's fp32 figures came back as a table of FAILED rows with exit status 0,
because `python3 bench/fused_cispo.py` without PYTHONPATH could not import scalerl_mega in its workers)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fused_cispo.py"


@pytest.fixture()
def bench():
    spec = importlib.util.spec_from_file_location("bench_fused_cispo", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_workers_get_the_repository_root_on_pythonpath(bench, monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen.update(cmd=cmd, env=kw["env"])
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps({"skipped": "x"}) + "\n", stderr="")

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    assert bench._run_worker("naive:256,8,16", []) == (None, "skipped: x")
    path = seen["env"]["PYTHONPATH"].split(os.pathsep)
    assert path == [str(BENCH.parents[1]), "/elsewhere"]
    assert (Path(path[0]) / "scalerl_mega" / "__init__.py").is_file()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("note,rc", [("FAILED: ModuleNotFoundError: No module named 'scalerl_mega'", 1),
                                     ("skipped: no CUDA device visible", 0)])
def test_a_failed_variant_fails_the_run_a_skipped_one_does_not(bench, monkeypatch, capsys, device, note, rc):
    monkeypatch.setattr(bench, "_run_worker", lambda spec, extra: (None, note))
    assert bench.main(["--device", device, "--shapes", "256,8,16", "--rounds", "1", "--variants", "naive"]) == rc
    assert note in capsys.readouterr().out


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_each_variant_is_appended_to_jsonl_before_the_next_runs(bench, monkeypatch, tmp_path, device):
    """--jsonl: a later variant that hangs (tools/gpu_check.sh kills it at its limit) keeps the earlier ones."""
    out = tmp_path / "head.jsonl"
    seen = []

    def fake_worker(spec, extra):
        seen.append([json.loads(ln)["variant"] for ln in out.read_text().splitlines()] if out.exists() else [])
        variant = spec.split(":")[0]
        if variant == "triton":
            raise KeyboardInterrupt  # stands for the kill: the driver never gets to its end
        return {"time_s": 2.0 if variant == "naive" else 1.0, "peak_gib": 1.0, "tflops": 1.0, "frac_bf16_peak": 0.1,
                "frac_fp32_peak": 0.1, "cpu_s": 1.0, "delta_rss_mb": 1.0, "max_rss_mb": 1.0, "loss": 0.5,
                "device_name": "x"}, None

    monkeypatch.setattr(bench, "_run_worker", fake_worker)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--device", device, "--shapes", "256,8,16", "--rounds", "1", "--variants", "naive", "trainer",
                    "triton", "--jsonl", str(out), "--json", str(tmp_path / "never.json")])
    assert seen == [[], ["naive"], ["naive", "trainer"]]
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [(r["variant"], r["N"], r["time_s"]) for r in rows] == [("naive", 256, 2.0), ("trainer", 256, 1.0)]
    assert not (tmp_path / "never.json").exists()
