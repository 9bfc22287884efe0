"""Qwen3 dense and Qwen3-MoE in the converter tables: names against what transformers itself saves (its
own reverse weight conversion is the oracle for the published per-expert layout), the MoE layout against
HF's MoE block, bit-exact round trips at TP/PP/EP > 1 through the CLIs, and an EP rank reading only its
own experts' tensors."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from scalerl_mega.convert import tables
from scalerl_mega.convert.dims import dims_from_hf_config
from scalerl_mega.convert.st_io import SafetensorsDir
from scalerl_mega.convert.tiny import save_tiny_hf, tiny_hf_config

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _saved_names(model) -> dict[str, tuple[int, ...]]:
    """Names and shapes transformers writes for `model` (save_pretrained reverts its load-time fusing)."""
    from transformers.core_model_loading import revert_weight_conversion

    return {n: tuple(t.shape) for n, t in revert_weight_conversion(model, model.state_dict()).items()}


@pytest.mark.parametrize("arch,tie", [("qwen3", True), ("qwen3", False), ("qwen3_moe", False), ("qwen3_moe", True)])
def test_table_names_and_shapes_are_what_transformers_saves(arch, tie):
    from transformers import AutoModelForCausalLM

    cfg = tiny_hf_config(arch, tie=tie)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    saved = _saved_names(model)
    if tie:  # transformers writes the tied head once, as the embedding
        saved.pop("lm_head.weight", None)
    d = dims_from_hf_config(json.loads(cfg.to_json_string()))
    names = tables.hf_names(d)
    assert len(set(names)) == len(names) and sorted(names) == sorted(saved)
    for n in names:
        assert tables.expected_hf_shape(n, d) == saved[n], n
    if arch == "qwen3_moe":
        assert d.moe_layers == (0, 2, 3) and d.moe_norm_topk and d.num_experts == 4 and d.moe_top_k == 2
        assert "model.layers.1.mlp.gate_proj.weight" in names  # mlp_only_layers=[1]: a dense MLP
        assert "model.layers.0.mlp.experts.3.down_proj.weight" in names and d.qk_layernorm


def _block_reference(block, x):
    with torch.no_grad():
        return block(x[None])[0]


@pytest.mark.parametrize("norm_topk", [True, False])
def test_moe_layout_and_megatron_routing_reproduce_hf_qwen3_moe_block(norm_topk):
    """Router and per-expert weights converted to Megatron names, run through Megatron's softmax top-k
    routing written here from its definition (pre_softmax=False: softmax over the top-k logits; True:
    softmax over all experts, then top-k), reproduce HF's Qwen3MoeSparseMoeBlock in float64."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from scalerl_mega.convert.model_config import model_config_from_hf

    torch.manual_seed(0)
    cfg = tiny_hf_config("qwen3_moe", norm_topk_prob=norm_topk)
    block = Qwen3MoeSparseMoeBlock(cfg).double()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    raw = {f"model.layers.0.mlp.{k}": v for k, v in block.state_dict().items()}
    d = dims_from_hf_config(json.loads(cfg.to_json_string()))
    sd = _per_expert(raw)
    mc = {}
    for g in tables.iter_groups(d, layers=[0], first_stage=False, last_stage=False):
        if all(n in sd for n in g.hf):
            mc.update(tables.hf_to_mcore(g, [sd[n] for n in g.hf], dims=d, padded_vocab=d.vocab_size))
    m = model_config_from_hf(json.loads(cfg.to_json_string()))
    assert m.moe_router_pre_softmax == (not norm_topk) and m.moe_router_score_function == "softmax"
    x = torch.randn(7, cfg.hidden_size, dtype=torch.float64)
    logits = x @ mc["decoder.layers.0.mlp.router.weight"].t()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        if m.moe_router_pre_softmax:
            w, ids = torch.topk(torch.softmax(logits[t], -1), m.moe_topk)
        else:
            top, ids = torch.topk(logits[t], m.moe_topk)
            w = torch.softmax(top, -1)
        for wk, e in zip(w, ids.tolist()):
            gate, up = (mc[f"decoder.layers.0.mlp.experts.linear_fc1.weight{e}"] @ x[t]).chunk(2)
            out[t] += wk * (mc[f"decoder.layers.0.mlp.experts.linear_fc2.weight{e}"] @ (torch.nn.functional.silu(gate) * up))
    assert torch.allclose(out, _block_reference(block, x), atol=1e-12)


def _per_expert(raw: dict) -> dict:
    """HF module state (fused `experts.gate_up_proj` [E, 2F, H], `experts.down_proj` [E, H, F]) -> the
    published per-expert names, split here by hand (independently of the tables)."""
    out = {}
    for k, v in raw.items():
        if k.endswith("experts.gate_up_proj"):
            for e in range(v.shape[0]):
                gate, up = v[e].chunk(2, dim=0)
                out[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate
                out[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = up
        elif k.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                out[k.replace("down_proj", f"{e}.down_proj.weight")] = v[e]
        else:
            out[k] = v
    return out


@pytest.fixture(scope="module")
def qwen_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen")
    out = {"qwen3_tied": str(root / "qwen3_tied"), "qwen3": str(root / "qwen3"), "qwen3_moe": str(root / "qwen3_moe")}
    save_tiny_hf("qwen3", out["qwen3_tied"], tie=True)
    save_tiny_hf("qwen3", out["qwen3"], max_shard_size="100KB")
    save_tiny_hf("qwen3_moe", out["qwen3_moe"], max_shard_size="100KB")
    return out


def _cli(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _all(d):
    s = SafetensorsDir(d)
    return {n: s.get(n) for n in s.names()}


@pytest.mark.parametrize("arch,layout", [
    ("qwen3_tied", ["--tp", "2", "--pp", "2"]), ("qwen3", ["--tp", "2"]),
    ("qwen3_moe", ["--tp", "2", "--ep", "2"]), ("qwen3_moe", ["--pp", "2", "--ep", "4", "--etp", "1"]),
    ("qwen3_moe", ["--tp", "2", "--pp", "2", "--ep", "2", "--etp", "2"]),
])
def test_cli_round_trip_bit_exact(qwen_dirs, tmp_path, arch, layout):
    mc, back = str(tmp_path / "mc"), str(tmp_path / "back")
    assert _cli("convert_hf_to_megatron").main(["--hf-dir", qwen_dirs[arch], "--out", mc, *layout, "--no-progress"]) == 0
    assert _cli("convert_megatron_to_hf").main(["--ckpt", mc, "--out", back, "--no-progress"]) == 0
    src, dst = _all(qwen_dirs[arch]), _all(back)
    assert sorted(src) == sorted(dst)
    for n in src:
        assert src[n].dtype == dst[n].dtype and torch.equal(src[n], dst[n]), n
    meta = json.load(open(os.path.join(mc, "megatron_convert.json")))
    cfg = json.load(open(os.path.join(back, "config.json")))
    assert meta["arch"] == arch.split("_tied")[0] and cfg["architectures"] == [
        "Qwen3MoeForCausalLM" if arch == "qwen3_moe" else "Qwen3ForCausalLM"]


def test_round_trip_output_loads_in_transformers_with_the_same_logits(qwen_dirs, tmp_path):
    from transformers import AutoModelForCausalLM

    from scalerl_mega.convert.pipeline import convert_hf_to_megatron
    from scalerl_mega.convert.to_hf import convert_megatron_to_hf

    mc, back = str(tmp_path / "mc"), str(tmp_path / "back")
    convert_hf_to_megatron(hf_dir=qwen_dirs["qwen3_moe"], out=mc, tp=2, ep=2)
    convert_megatron_to_hf(ckpt=mc, out=back, max_shard_bytes=100_000)
    a = AutoModelForCausalLM.from_pretrained(qwen_dirs["qwen3_moe"], local_files_only=True)
    b = AutoModelForCausalLM.from_pretrained(back, local_files_only=True)
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(tokens).logits, b(tokens).logits)


def test_an_expert_parallel_rank_reads_only_its_own_experts(qwen_dirs):
    """Per-expert tensors: a rank of EP rank 1 of 2 (experts 2, 3) on pipeline stage 2 of 2 (layers 2, 3)
    reads exactly its layers' non-expert tensors and its two experts' tensors, none of experts 0, 1."""
    from scalerl_mega.convert.hf_layout import read_layout
    from scalerl_mega.convert.load import HFShardReader, hf_tensor_source

    path = qwen_dirs["qwen3_moe"]
    hf = read_layout(path)
    dims = dims_from_hf_config(hf.text_config)
    groups = [g for g in tables.iter_groups(dims) if g.layer in (2, 3)]
    mine = [g for g in groups if not (g.rule.per_expert and g.hf[0].split(".experts.")[1][0] in "01")]
    wanted = {n for g in mine for n in g.mcore}
    src = HFShardReader(path)
    full_tensor = hf_tensor_source(src, hf, dims, wanted=wanted)
    ref = SafetensorsDir(path)
    for name in sorted(wanted):
        group = next(g for g in mine if name in g.mcore)
        want = dict(tables.hf_to_mcore(group, [ref.get(n) for n in group.hf], dims=dims, padded_vocab=dims.vocab_size))
        assert torch.equal(full_tensor(name), want[name]), name
    read = sum(ref.nbytes(n) for g in mine for n in g.hf)
    others = sum(ref.nbytes(n) for g in groups if g not in mine for n in g.hf)
    assert others > 0 and src.bytes_read == read


def test_model_config_from_qwen3_moe_config_and_back():
    from scalerl_mega.convert.model_config import dims_from_model_config, model_config_from_hf
    from scalerl_mega.model.hf_export import hf_config_from_model

    cfg = json.loads(tiny_hf_config("qwen3_moe").to_json_string())
    m = model_config_from_hf(cfg)
    assert (m.arch, m.num_experts, m.moe_topk, m.moe_ffn_hidden_size, m.shared_expert_ffn) == ("qwen3_moe", 4, 2, 32, 0)
    assert (m.moe_layer_freq, m.moe_dense_layers, m.qk_layernorm, m.kv_channels) == (1, [1], True, 32)
    assert [m.is_moe_layer(i) for i in range(4)] == [True, False, True, True]
    assert (m.moe_router_load_balancing_type, m.moe_aux_loss_coeff, m.rope_theta) == ("aux_loss", 0.001, 1e6)
    assert dims_from_model_config(m) == dims_from_hf_config(cfg)
    arch, kwargs = hf_config_from_model(m)
    assert arch == "qwen3_moe" and (kwargs["mlp_only_layers"], kwargs["norm_topk_prob"], kwargs["num_experts"]) == ([1], True, 4)
    step2 = model_config_from_hf({**cfg, "mlp_only_layers": [], "decoder_sparse_step": 2})
    assert (step2.moe_layer_freq, step2.moe_dense_layers) == (2, [])
    assert [step2.is_moe_layer(i) for i in range(4)] == [False, True, False, True]


@pytest.mark.parametrize("change,match", [
    ({"num_experts": 8}, "num_experts=8 and num_local_experts=4 disagree"),
    ({"mlp_only_layers": [0, 1, 2, 3]}, "no MoE layer"),
    ({"mlp_only_layers": [7]}, r"mlp_only_layers=\[7\] names layer 7"),
    ({"num_experts_per_tok": 5}, r"num_experts_per_tok=5 must be in \[1, num_experts=4\]"),
    ({"use_sliding_window": True}, "use_sliding_window=True is not supported"),
])
def test_unsupported_qwen3_moe_configs_are_named(change, match):
    cfg = {**json.loads(tiny_hf_config("qwen3_moe").to_json_string()), **change}
    with pytest.raises(ValueError, match=match):
        dims_from_hf_config(cfg)


def test_qk_layernorm_must_match_the_architecture():
    from scalerl_mega.model.config import ModelConfig

    with pytest.raises(ValueError, match=r"qk_layernorm=False but arch='qwen3' \(Qwen3\) has per-head q/k RMSNorm; set "
                                         r"model.qk_layernorm=true"):
        ModelConfig(arch="qwen3").validate()
    with pytest.raises(ValueError, match="qk_layernorm=True but arch='llama'"):
        ModelConfig(arch="llama", qk_layernorm=True).validate()
    with pytest.raises(ValueError, match=r"moe_dense_layers=\[5\] names 5"):
        ModelConfig(arch="qwen3_moe", qk_layernorm=True, num_experts=4, moe_topk=2, moe_dense_layers=[5]).validate()


def test_a_shared_expert_has_no_qwen3_moe_name():
    import dataclasses

    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.model.config import load_model_preset

    m = dataclasses.replace(load_model_preset("tiny_qwen3_moe"), shared_expert_ffn=32)
    with pytest.raises(ValueError, match="shared_expert_ffn=32 but HF Qwen3-MoE has no shared expert"):
        dims_from_model_config(m)
