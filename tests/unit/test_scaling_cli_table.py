"""What `scalerl-fit` prints, as rendered text: B and C_mid of a run whose A is not identified (the figures
report.md prints for it), the leave-one-out line without a common A, and every table's columns aligned."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from scalerl_mega.report import write_report
from scalerl_mega.scaling.cli import main


def _run(d: Path, reward) -> Path:
    """A CPU run's metrics.jsonl: 12 validation points (400 samples each) at device-hours 0.01..0.12."""
    d.mkdir(parents=True)
    with (d / "metrics.jsonl").open("w") as fh:
        for i, r in enumerate(reward):
            fh.write(json.dumps({"kind": "validation", "step": i, "val_pass_rate": float(r), "compute_gpu_hours": 0.0,
                                 "compute_device_hours": 0.01 * (i + 1), "val_prompts": 100,
                                 "val_samples_per_prompt": 4}) + "\n")
    return d


def _linear(tmp_path, name, slope):
    """Still rising linearly at the end: A is not identified (the data stop before C_mid)."""
    return _run(tmp_path / name, 0.2 + slope * np.arange(12))


def _saturated(tmp_path, name):
    """Eq. 1 with A 0.7, B 2, C_mid 0.02, R0 0.2, noise-free: far past C_mid, A identified."""
    c = 0.01 * np.arange(1, 13)
    return _run(tmp_path / name, 0.2 + 0.5 / (1 + (0.02 / c) ** 2))


def _tables(text: str) -> list[list[str]]:
    """Every table in the output: the header, its dash line and the rows up to the next unindented/other line."""
    lines = text.splitlines()
    out = []
    for k, line in enumerate(lines):
        if k and re.fullmatch(r" *-+( +-+)*", line):
            indent = len(line) - len(line.lstrip())
            rows = [lines[k - 1], line]
            for row in lines[k + 1:]:
                if not row.startswith(" " * indent) or row[indent:indent + 1] == " " or not row.strip():
                    break
                rows.append(row)
            out.append(rows)
    return out


def _assert_aligned(table: list[str]) -> None:
    """Each cell starts where its column's dashes start and ends before the next column's: 2 spaces apart."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", table[1])]
    for row in [table[0], *table[2:]]:
        for (start, _), (_, end) in zip(spans[1:], spans[:-1]):
            assert row[end:start].strip() == "" and row[start:start + 1] != " ", (row, start)


def test_not_identified_runs_show_b_and_c_mid_and_no_nan_loo_line(tmp_path, capsys):
    a, b = _linear(tmp_path, "runa", 0.02), _linear(tmp_path, "runb", 0.03)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    report = write_report(a, title="runa").read_text()
    fit_row = next(line for line in report.splitlines() if line.startswith("| not identified |")).split("|")
    B, C_mid = fit_row[3].strip(), fit_row[4].strip()
    row = next(line for line in out.splitlines() if line.startswith("runa "))
    assert row.split() == ["runa", "11", "not", "identified", fit_row[2].strip(), B, C_mid, "NO", "0.0362", "/",
                           "0.0188", "=", "1.9x", "(unvetted)", "-"]
    assert (B, C_mid) == ("1.460", "0.2058")  # the grid fit of a straight line 0.2 + 2t, t = 0..11
    assert "nan" not in out.lower() and "over 0 runs" not in out
    assert ("leave-one-out (paper Sec. 6 / App. A.5): no common A to refit at: none of the 2 runs has an "
            "identified A (each run's notes above say why); B and C_mid above are each run's own fit") in out
    tables = _tables(out)
    assert [t[0].split()[0] for t in tables] == ["run", "compute", "compute"]
    for t in tables:
        _assert_aligned(t)
    assert main([str(a), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["loo"]["A_mean"] is None  # valid JSON, no NaN


def test_loo_with_one_identified_run_says_whose_a(tmp_path, capsys):
    a, s = _linear(tmp_path, "runa", 0.02), _saturated(tmp_path, "sat")
    assert main([str(a), str(s)]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("leave-one-out"))
    A = float(re.search(r"A=(\d\.\d{4})", head).group(1))
    assert A == pytest.approx(0.7, abs=0.01)
    assert head == (f"leave-one-out at the common A={A:.4f} (the A of the one identified run; every run refit at "
                    "it, paper Sec. 6 / App. A.5):")
    tables = _tables(out)
    assert tables[-1][0].split() == ["run", "A", "A", "-", "mean", "B", "at", "mean", "A", "C_mid", "at", "mean", "A",
                                     "note"]
    assert any("excluded" in r for r in tables[-1]) and any("best B" in r for r in tables[-1])
    for t in tables:
        _assert_aligned(t)


def test_alignment_check_catches_a_shifted_cell():
    good = ["a    bb", "---  --", "xyz  1"]
    _assert_aligned(good)
    with pytest.raises(AssertionError):
        _assert_aligned(["a    bb", "---  --", "xyzw 1"])
