"""Qwen3-Next-80B-A3B at full size on the meta device (`dry_run=true`): 24 H200 ranks, TP 2 x PP 3 x EP 8 (the
layout tools/plan.py --preset qwen3_next_80b_a3b suggests for 16k sequences) initialise in Megatron with the local
GDN spec; every pipeline stage holds the planner's parameters (within 0.1%) and the planned peak fits an H200."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_dry_run import run_cli


@pytest.mark.compat
@pytest.mark.timeout(900)
def test_qwen3_next_80b_builds_at_full_size_and_fits_h200(tmp_path):
    from scalerl_mega.cluster import plan as P
    from scalerl_mega.dry_run import model_shape
    from scalerl_mega.model.config import load_model_preset

    out = tmp_path / "dry"
    r = run_cli(out, "experiment=qwen3_moe", "model=qwen3_next_80b_a3b", "cluster.trainer_devices=24", "parallel.tp=2",
                "parallel.pp=3", "parallel.ep=8", "dry_run_gpu=h200")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "dry_run.json").read_text())
    shape, lay = model_shape(load_model_preset("qwen3_next_80b_a3b")), P.TrainLayout(tp=2, pp=3, dp=4, ep=8)
    for rank in report["ranks"].values():
        want = sum(P.stage_params(shape, lay, rank["pp_rank"]).values())
        assert abs(rank["params"] - want) / want < 1e-3, (rank["role"], rank["params"], want)
    assert {r["pp_rank"] for r in report["ranks"].values()} == {0, 1, 2}
    assert report["devices"]["h200"]["fits"]
