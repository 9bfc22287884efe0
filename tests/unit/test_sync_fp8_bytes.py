"""FP8 bytes of a weight sync (`rollout.quantization=fp8`; cluster/weight_bytes.py, cluster/sync_model.py,
`tools/plan.py --sync-table`): counted matrix by matrix, by hand on a small shape, equal to the tensors the exporter
sends for every model preset, equal to the bytes a real quantize-on-sync moves into the local engine process, and
the source of the sync table's FP8 rows and of the docs' figures."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from scalerl_mega.cluster.plan import MODELS, ModelShape, TrainLayout
from scalerl_mega.cluster.sync_model import SyncLinks, estimate_sync, sender_bytes
from scalerl_mega.cluster.weight_bytes import model_bytes

ROOT = Path(__file__).resolve().parents[2]


def test_fp8_bytes_by_hand():
    """hidden 200, 2 heads x 100, 1 KV head, dense ffn 300, vocab 50, one layer. Projections [out, in] and their
    128x128 blocks: q [200, 200] 2x2, k and v [100, 200] 1x2, o [200, 200] 2x2, gate and up [300, 200] 3x2,
    down [200, 300] 2x3: 26 blocks, 4 bytes each; 1 byte per projection weight; norms, embedding, head in bf16."""
    m = ModelShape(name="hand", hidden=200, layers=1, heads=2, kv_heads=1, head_dim=100, ffn=300, vocab=50)
    proj = 200 * 200 * 2 + 100 * 200 * 2 + 300 * 200 * 3
    rest = 2 * 200 + 50 * 200 * 2 + 200  # two layer norms, embedding + head, final norm
    assert model_bytes(m, dtype_bytes=2) == 2 * (proj + rest) == 2 * m.total_params()
    assert model_bytes(m, dtype_bytes=2, quantization="fp8") == proj + 4 * (4 + 2 + 2 + 4 + 6 + 6 + 6) + 2 * rest
    with pytest.raises(ValueError, match="quantization='int4'"):
        model_bytes(m, dtype_bytes=2, quantization="int4")


def _preset_shape(name: str) -> tuple[ModelShape, bool]:
    from scalerl_mega.dry_run import model_shape
    from scalerl_mega.model.config import load_model_preset

    cfg = load_model_preset(name)
    return MODELS.get(name) or model_shape(cfg), cfg.arch == "llama4"  # Llama-4: fused 3-D experts


@pytest.mark.parametrize("name", [*MODELS, "tiny_qwen3_moe", "tiny_deepseek_v3", "tiny_qwen3", "demo_moe",
                                  "qwen3_5_35b_a3b", "tiny_qwen3_next", "tiny_qwen3_5", "tiny_qwen3_5_moe"])
def test_bytes_equal_the_exporters_tensors(name):
    """The exporter's plan (convert/tables.py names and shapes; FP8: `quant.fp8.quantized_shapes`) sums to the
    counted bytes, bf16 and FP8, for every planner model and the tiny ones (DeepSeek-V3's router bias, MLA's
    kv_a_proj_with_mqa [576, 7168] in partial blocks, Llama-4's fused experts left in bf16)."""
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.trainer.megatron.export import export_plan
    from scalerl_mega.weight_sync.plan import spec_bytes

    cfg = load_model_preset(name)
    shape, fused = _preset_shape(name)
    for dtype, quantization in (("bfloat16", "none"), ("bfloat16+fp8", "fp8")):
        sent = sum(spec_bytes(s) for s in export_plan(cfg, dtype=dtype))
        assert model_bytes(shape, dtype_bytes=2, quantization=quantization, fused_experts=fused) == sent, dtype


@pytest.mark.usefixtures("one_torch_thread")
def test_bytes_equal_a_real_fp8_push_into_the_local_engine():
    """tiny_qwen3_moe in FP32 (the CPU runs' weights): the exporter's tensors, quantized on sync, broadcast into an
    FP8 local engine process; the sender's byte count (`sync/bytes`) is the counted FP8 bytes at 4 bytes a
    parameter left unquantized, and about a quarter plus the unquantized share of the FP32 push."""
    import torch

    from scalerl_mega.loop import single_sender_metrics
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.quant.fp8 import quantize_named
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine
    from scalerl_mega.trainer.megatron.export import export_plan

    cfg = load_model_preset("tiny_qwen3_moe")
    arch, kwargs = hf_config_from_model(cfg)
    engine = LocalRolloutEngine(LocalEngineConfig(model=LocalModelSpec(arch=arch, config=kwargs, quantization="fp8"),
                                                  core=CoreConfig(max_batch=2, max_seq_len=16)))
    try:
        gen = torch.Generator().manual_seed(0)
        named = [(s.name, torch.randn(s.shape, generator=gen) * 0.02) for s in export_plan(cfg, dtype="float32")]
        engine.update_weights(quantize_named(named), version=1)
        sent = single_sender_metrics(engine.last_sync_stats, seconds=0.0)["sync/bytes"]
    finally:
        engine.close()
    shape, _ = _preset_shape("tiny_qwen3_moe")
    assert sent == model_bytes(shape, dtype_bytes=4, quantization="fp8")
    assert sent == sum(sender_bytes(shape, TrainLayout(), bytes_per_param=4, quantization="fp8"))
    assert sent < 0.6 * 4 * shape.total_params()


def test_sync_table_fp8_rows_come_from_the_same_count(capsys, monkeypatch):
    """`--sync-table --json`: every layout has bf16 and FP8 rows; an FP8 row's bytes are `model_bytes` of its model,
    its seconds `estimate_sync` with `quantization="fp8"`; MoE models send about half, dense 8B models more (their
    embedding and head stay bf16), Scout nearly all (fused experts); the docs state those ranges."""
    monkeypatch.setattr(sys, "path", [str(ROOT / "tools"), *sys.path])
    assert importlib.import_module("plan").main(["--sync-table", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {(r["layout"], r["quantization"], r["backend"], r["senders"]): r for r in rows}
    ratios: dict[str, float] = {}
    for (layout, q, backend, senders), r in by.items():
        m = MODELS[r["model"]]
        assert r["total_bytes"] == model_bytes(m, dtype_bytes=2, quantization=q)
        if q == "fp8":
            bf = by[(layout, "none", backend, senders)]
            ratios[r["model"]] = r["total_bytes"] / bf["total_bytes"]
            assert r["seconds"] < bf["seconds"]
    from scalerl_mega.cluster.layouts import shipped_layouts

    sl = shipped_layouts()["train_qwen3_moe"]
    e = estimate_sync(MODELS[sl.model], sl.train_layout(), SyncLinks(quantization="fp8"), backend="sglang",
                      senders="per_stage")
    assert by[("train_qwen3_moe", "fp8", "sglang", "per_stage")]["seconds"] == round(e.seconds, 3)
    moe = [ratios[n] for n in ("qwen3_30b_a3b", "qwen3_235b_a22b", "moonlight_16b_a3b", "deepseek_v3_671b")]
    dense = [ratios[n] for n in ("llama3_8b", "qwen3_8b")]
    tables = [2 * 2 * MODELS[n].vocab * MODELS[n].hidden / 2**30 for n in ("llama3_8b", "qwen3_8b")]
    docs = " ".join((ROOT / "docs" / "cluster_and_gpu.md").read_text().split())
    assert f"bf16 bytes ({min(moe):.2f}-{max(moe):.2f})" in docs
    assert f"the dense 8B models {min(dense):.2f}-{max(dense):.2f}" in docs
    assert f"(their untied embedding and head, {min(tables):.1f}-{max(tables):.1f} GiB in bf16, stay)" in docs
    assert f"Scout only {ratios['scout_17b16e']:.2f}" in docs
