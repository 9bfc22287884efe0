"""The Gated DeltaNet hybrids at full size on the meta device (`dry_run=true`): the layouts slurm/train_qwen3_next.sh
documents for Qwen3-Next-80B-A3B (16 H200, 24 H100, 12 GB200) initialise in Megatron with the local GDN spec at their
real world sizes, every pipeline stage and expert rank holds exactly the planner's parameters (cluster/plan.py
`stage_params`: GDN mixers split over TP but for the gated norm's weight, q/k norms in the full-attention layers
only, the shared expert's gate) and the planned peak fits the GPU type each is documented for. Qwen3.5-35B-A3B on
four stages, whose layer kinds differ per stage (layers 0-9 hold two full-attention layers, 10-19 three), too."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_dry_run import _check_full_size_layouts, run_cli

QWEN3_NEXT_LAYOUTS = {  # name: (script, env of its `layout[...]` line, the GPU type it is documented for)
    "qwen3_next_80b_a3b@h200": ("train_qwen3_next.sh", {}, "h200"),
    "qwen3_next_80b_a3b@h100": ("train_qwen3_next.sh", {"TRAINER_NODES": "3", "TP": "2", "PP": "3", "EP": "8",
                                                        "GEN_TP": "4"}, "h100_80gb"),
    "qwen3_next_80b_a3b@gb200": ("train_qwen3_next.sh", {"GPUS_PER_NODE": "4", "TRAINER_NODES": "3", "TP": "2",
                                                         "PP": "3", "EP": "4", "GEN_TP": "2"}, "gb200"),
}


@pytest.mark.compat
@pytest.mark.timeout(900)
def test_qwen3_next_layouts_build_at_full_size_and_fit(tmp_path):
    _check_full_size_layouts(tmp_path, QWEN3_NEXT_LAYOUTS)


@pytest.mark.compat
@pytest.mark.timeout(900)
def test_qwen3_5_35b_stages_of_mixed_layers_hold_the_planned_parameters(tmp_path):
    from scalerl_mega.cluster import plan as P
    from scalerl_mega.dry_run import model_shape
    from scalerl_mega.model.config import load_model_preset

    out = tmp_path / "dry"
    r = run_cli(out, "experiment=qwen3_moe", "model=qwen3_5_35b_a3b", "cluster.trainer_devices=16", "parallel.tp=2",
                "parallel.pp=4", "parallel.ep=4", "dry_run_gpu=h200")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "dry_run.json").read_text())
    shape, lay = model_shape(load_model_preset("qwen3_5_35b_a3b")), P.TrainLayout(tp=2, pp=4, dp=2, ep=4)
    assert {r["pp_rank"] for r in report["ranks"].values()} == {0, 1, 3}
    for rank in report["ranks"].values():
        assert rank["params"] == sum(P.stage_params(shape, lay, rank["pp_rank"]).values()), rank["role"]
