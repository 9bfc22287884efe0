"""Per-domain validation (paper Sec. 5: separate math and code curves): `val/<domain>_pass_rate` from
the validation groups, per-domain rows and fitted curves in report.md, and `scalerl-fit --domains`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalerl_mega.metrics.val_window import outcomes, val_metrics
from scalerl_mega.report import write_report
from scalerl_mega.scaling.cli import main
from scalerl_mega.scaling.fit import sigmoid_law
from scalerl_mega.types import Completion, FinishReason, Group, Prompt, ScoredCompletion


def _group(task: str, passes: list[bool], i: int) -> Group:
    c = Completion(prompt_id="p", sample_index=0, prompt_ids=[1], output_ids=[2], gen_logprobs=[0.0],
                   weight_versions=[0], finish_reason=FinishReason.STOP)
    return Group(prompt=Prompt(prompt_id=f"{task}{i}", text="", task=task, gold="1"),
                 samples=[ScoredCompletion(completion=c, reward=1.0 if p else -1.0, passed=p) for p in passes])


def test_domain_pass_rates_hand_example():
    groups = [_group("math", [True, False, True, True], 0), _group("code", [False, False], 1),
              _group("math", [False, False], 2), _group("code", [True, False], 3)]
    out = val_metrics(outcomes(groups, index_of={g.prompt.prompt_id: i for i, g in enumerate(groups)}))
    assert {k: v for k, v in out.items() if k.startswith("val/")} == {
        "val/code_pass_rate": 0.25, "val/code_samples": 4.0, "val/math_pass_rate": 0.5, "val/math_samples": 6.0}
    assert out["val_pass_rate"] == 4 / 10 and out["val_prompts"] == 4


TRUE = {"math": dict(A=0.70, B=1.8, C_mid=30.0, R0=0.2), "code": dict(A=0.45, B=1.2, C_mid=60.0, R0=0.1)}


def _run_dir(tmp_path):
    compute = np.geomspace(2.0, 400.0, 40)  # >= 8 points after the fit cut (scaling.identify)
    lines = []
    for k, c in enumerate(compute):
        rec = {"kind": "validation", "step": 10 * k, "compute_device_hours": float(c), "compute_gpu_hours": 0.0}
        for d, p in TRUE.items():
            rec[f"val/{d}_pass_rate"] = float(sigmoid_law(np.array([c]), **p)[0])
        rec["val_pass_rate"] = 0.5 * (rec["val/math_pass_rate"] + rec["val/code_pass_rate"])
        lines.append(json.dumps(rec))
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_report_has_a_row_and_a_curve_per_domain(tmp_path):
    run = _run_dir(tmp_path)
    text = write_report(run, title="mixed").read_text()
    assert "## Per domain" in text
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| math") or line.startswith("| code")}
    for d, p in TRUE.items():
        first = float(sigmoid_law(np.array([2.0]), **p)[0])
        assert float(rows[d][0]) == pytest.approx(first, abs=1e-3)  # first validation point
        assert float(rows[d][3]) == pytest.approx(p["A"], abs=0.02)  # fitted A of the domain
    assert (run / "scaling.png").exists()


def test_scalerl_fit_domains(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert main([str(run), "--domains", "--x", "compute_device_hours", "--json", "--holdout", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    runs = {r["run"]: r for r in out["runs"]}
    assert set(runs) == {"run/code", "run/math"}
    for d, p in TRUE.items():
        assert runs[f"run/{d}"]["A"] == pytest.approx(p["A"], abs=0.02)
    assert main([str(run), "--domains", "--x", "compute_device_hours", "--y", "val_pass_rate"]) == 0  # --y unused
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "validation", "step": 0, "compute_gpu_hours": 1.0,
                                                   "val_pass_rate": 0.1}) + "\n")
    assert main([str(run), "--domains"]) == 2
    assert "--domains found no val/<domain>_pass_rate key" in capsys.readouterr().err
