"""reproduction/sglang_rl_compare.py's reporting on hand-written run outputs: the figures of one run (resumed steps
deduplicated, first/last reward means, on-policy gap, versions, staleness), the side-by-side table and the PNG
(the runs themselves are `make sglang-rl-compare`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sglang_rl_compare", ROOT / "reproduction/sglang_rl_compare.py")
tool = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = tool
_spec.loader.exec_module(tool)


def _step(step: int, reward: float, *, version: int | None = None, gap: tuple[float, float] | None = None,
          hist: dict | None = None) -> dict:
    rec = {"kind": "train", "step": step, "reward_mean": reward, "step_s": float(step), "weight_sync_s": 0.1 * step,
           "tokens_per_s": 100.0, "weight_version": float(step if version is None else version),
           "staleness_hist": hist if hist is not None else {"0": 2, "1": 2}}
    if gap is not None:
        rec["train/onpolicy_abs_log_ratio_max"], rec["train/onpolicy_abs_log_ratio_mean"] = gap
    return rec


def _run(path: Path, records: list[dict], *, launches: list[dict] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if launches is not None:
        (path / "launches.json").write_text(json.dumps(launches))
    return path


def test_summary_of_a_resumed_run(tmp_path):
    # step 2 written twice (a resumed launch rewrote it): the later record wins
    recs = [_step(1, -1.0, gap=(3e-6, 1e-6), hist={"0": 4}), _step(2, 0.0), _step(3, 0.5), _step(2, -0.5),
            {"kind": "val", "step": 0, "val_pass_rate": 0.25}, _step(4, 1.0),
            {"kind": "val", "step": 4, "val_pass_rate": 0.5}]
    run = tool.load_run(_run(tmp_path / "sglang", recs, launches=[{"wall_s": 100.0, "server_start_s": 40.0},
                                                                   {"wall_s": 50.0, "server_start_s": 20.0}]))
    s = tool.summarize(run, edge=2)
    assert s["steps"] == 4 and s["reward"] == [-1.0, -0.5, 0.5, 1.0]
    assert s["reward_first"] == pytest.approx(-0.75) and s["reward_last"] == pytest.approx(0.75)
    assert s["val"] == [(0, 0.25), (4, 0.5)]
    assert s["wall_s"] == 150.0 and s["server_start_s"] == 60.0
    assert s["rl_s"] == 10.0 and s["step_s_median"] == 2.5  # step_s = 1, 2, 3, 4
    assert s["sync_s"] == pytest.approx((0.1, 0.4))
    assert s["gap_max"] == 3e-6 and s["gap_mean"] == 1e-6 and s["gap_steps"] == 1
    assert s["versions"] == [1, 2, 3, 4] and s["versions_ok"]
    assert s["staleness_hist"] == {0: 10.0, 1: 6.0}  # 4 + 2 + 2 + 2 at age 0; 2 + 2 + 2 at age 1
    assert s["staleness_mean"] == pytest.approx(6 / 16)


def test_a_step_without_a_push_is_reported(tmp_path):
    s = tool.summarize(tool.load_run(_run(tmp_path / "local", [_step(1, 0.0), _step(2, 0.0, version=1)])))
    assert s["versions"] == [1, 1] and not s["versions_ok"]
    assert "NOT equal to the step" in tool._versions(s)


def test_table_and_plot_side_by_side(tmp_path):
    _run(tmp_path / "sglang", [_step(1, -1.0, gap=(3.3e-6, 1.2e-6)), _step(2, 0.0)],
         launches=[{"wall_s": 1234.4, "server_start_s": 61.0}])
    _run(tmp_path / "local", [_step(1, -0.5, gap=(9.5e-7, 2e-7)), _step(2, 0.5),
                              {"kind": "val", "step": 2, "val_pass_rate": 0.375}], launches=[{"wall_s": 99.6}])
    text = tool.write_report(tmp_path)
    table = text.splitlines()
    assert "| | real SGLang 0.5.23 (CPU) | local engine |" in table
    assert "| RL steps | 2 | 2 |" in table
    assert "| SGLang server start | 61 s | - |" in table
    assert "| wall time, all launches (SFT + engine start + RL + validation) | 1234 s | 100 s |" in table
    assert f"| reward, mean of the first {tool.EDGE} steps -> last {tool.EDGE} | -0.500 -> -0.500 (+0.000) | " \
           "+0.000 -> +0.000 (+0.000) |" in table  # 2 steps: both means over both
    assert any(line.startswith("| on-policy") and "| 3.3e-06 / 1.2e-06 (1) | 9.5e-07 / 2.0e-07 (1) |" in line
               for line in table)
    assert "| weight version per step | 1, 2 (= step, every step) | 1, 2 (= step, every step) |" in table
    assert (tmp_path / "sglang_rl.md").read_text() == text
    assert (tmp_path / "sglang_rl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
