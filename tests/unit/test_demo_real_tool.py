"""tools/demo_real.py's reporting on hand-written run outputs: the validation curve read from metrics.jsonl,
the per-seed rise table, and the PNG plot (the runs themselves are `make demo-real`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("demo_real", ROOT / "tools/demo_real.py")
demo_real = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = demo_real
_spec.loader.exec_module(demo_real)


def _metrics(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")
    return path


def test_val_curve_keeps_only_validation_records_in_order(tmp_path):
    m = _metrics(tmp_path / "metrics.jsonl", [
        {"step": 0, "val_pass_rate": 0.25}, {"step": 1, "pass_rate": 0.9}, {"step": 5, "val_pass_rate": 0.3125},
        {"step": 10, "val_pass_rate": 0.375, "val_seconds": 12.0}, {"step": 10}])
    assert demo_real.val_curve(m) == [(0, 0.25), (5, 0.3125), (10, 0.375)]
    assert demo_real.val_curve(tmp_path / "absent.jsonl") == []


def test_summary_table_rises_and_their_mean_and_minimum():
    rows = [{"seed": 0, "curve": [(0, 0.25), (10, 0.375)], "wall_s": 1799.6},
            {"seed": 1, "curve": [(0, 0.5), (5, 0.5), (8, 0.5625)], "wall_s": 1800.2},
            {"seed": 2, "curve": [], "wall_s": 3.0}, {"seed": 3, "curve": [(0, 0.125)], "wall_s": 60.0}]
    table = demo_real.summary_table(rows)
    assert "| 0 | 10 | 2 | 0.250 | 0.375 | +0.125 | 1800 |" in table
    assert "| 1 | 8 | 3 | 0.500 | 0.562 | +0.062 | 1800 |" in table  # 0.5625 - 0.5 = 0.0625
    assert "| 2 | - | 0 | - | - | - | 3 |" in table
    assert "| 3 | 0 | 1 | 0.125 | 0.125 | - | 60 |" in table  # one validation: no rise
    assert "mean rise over 2 seed(s): +0.094; smallest: +0.062" in table  # (0.125 + 0.0625) / 2 = 0.09375


def test_plot_curves_writes_a_png(tmp_path):
    rows = [{"seed": 0, "curve": [(0, 0.2), (4, 0.3)], "wall_s": 1.0}, {"seed": 1, "curve": [], "wall_s": 1.0}]
    path = demo_real.plot_curves(rows, tmp_path / "sub" / "p.png")
    assert path == tmp_path / "sub" / "p.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_smollm2_cpu_forced_box_interruption_is_what_the_math_reward_reads():
    """make demo-real's settings: an interrupted answer ends in the forced box, which the reward scores."""
    from omegaconf import OmegaConf

    from scalerl_mega.rewards.math import score_math

    cfg = OmegaConf.load(ROOT / "conf/experiment/smollm2_cpu.yaml")
    phrase = cfg.length.interruption_phrase
    assert phrase == "\nThe final answer is \\boxed{"
    assert cfg.data.template.format(problem="P?") == "P?\nThink briefly, then put the final answer in \\boxed{}."
    assert cfg.length.interruption_max + cfg.length.answer_budget <= cfg.length.max_new_tokens
    assert score_math("Tom has 4 + 8 = 12 stick" + phrase + "12}", "12", require_think=False).passed
    # the box decides, not a number written before the interruption
    assert not score_math("Tom has 4 + 8 = 12 stick" + phrase + "13}", "12", require_think=False).passed
