"""init_from_hf reads only what a rank needs (convert/load.py): the shards that hold its tensors, located
by the safetensors index, and of a fused expert tensor only its experts' rows. No Megatron needed: the
rank is described by the set of global Megatron names it holds."""

from __future__ import annotations

import json
import os

import pytest
import torch

from scalerl_mega.convert import tables
from scalerl_mega.convert.dims import dims_from_hf_config
from scalerl_mega.convert.hf_layout import read_layout
from scalerl_mega.convert.load import HFShardReader, hf_tensor_source
from scalerl_mega.convert.st_io import SafetensorsDir
from scalerl_mega.convert.tiny import save_tiny_hf


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hf") / "llama4")
    save_tiny_hf("llama4", path, max_shard_size="100KB")
    return path


def _reference(path, dims):
    """Every Megatron tensor converted from fully read HF tensors (the pre-change path)."""
    full = SafetensorsDir(path)
    out = {}
    for g in tables.iter_groups(dims):
        out.update(tables.hf_to_mcore(g, [full.get(n) for n in g.hf], dims=dims, padded_vocab=dims.vocab_size))
    return out


def test_a_rank_opens_only_the_shards_holding_its_tensors(sharded):
    hf = read_layout(sharded)
    dims = dims_from_hf_config(hf.text_config)
    weight_map = json.load(open(os.path.join(sharded, "model.safetensors.index.json")))["weight_map"]
    shards = sorted(set(weight_map.values()))
    assert len(shards) >= 4, shards  # a checkpoint of many shards
    # a rank of pipeline stage 2 of 2 (layers 2, 3 of 4) and expert-parallel rank 1 of 2 (experts 2, 3 of 4)
    groups = [g for g in tables.iter_groups(dims) if g.layer in (2, 3)]
    wanted = {n for g in groups for n in g.mcore if not ("experts.linear_fc" in n and n[-1] in "01")}
    src = HFShardReader(sharded)
    full_tensor = hf_tensor_source(src, hf, dims, wanted=wanted)
    ref = _reference(sharded, dims)
    for name in sorted(wanted):
        assert torch.equal(full_tensor(name), ref[name]), name
    needed = {weight_map[n] for g in groups for n in g.hf}
    assert set(src.opened) == needed and len(needed) < len(shards), (src.opened, needed)
    # of each fused expert tensor [E, ...] only experts 2..3: half its bytes
    full = SafetensorsDir(sharded)
    fused = [n for g in groups if "{e}" in g.rule.mcore[0] for n in g.hf]
    other = [n for g in groups if "{e}" not in g.rule.mcore[0] for n in g.hf]
    assert len(fused) == 4 and full.shape(fused[0])[0] == 4
    assert src.bytes_read == sum(map(full.nbytes, other)) + sum(map(full.nbytes, fused)) // 2


def test_reader_names_a_missing_shard_and_a_wrong_shape(sharded, tmp_path):
    hf = read_layout(sharded)
    dims = dims_from_hf_config(hf.text_config)
    copy = tmp_path / "ck"
    copy.mkdir()
    for f in os.listdir(sharded):
        os.symlink(os.path.join(sharded, f), copy / f)
    index = json.load(open(copy / "model.safetensors.index.json"))
    victim = index["weight_map"]["model.layers.3.self_attn.o_proj.weight"]
    os.remove(copy / victim)
    src = HFShardReader(str(copy))
    with pytest.raises(ValueError, match=f"{victim} .named by model.safetensors.index.json. does not exist"):
        hf_tensor_source(src, hf, dims, wanted=[])("decoder.layers.3.self_attention.linear_proj.weight")
    bad = tables.expected_hf_shape
    try:
        tables.expected_hf_shape = lambda name, d: (1, 2)
        with pytest.raises(ValueError, match=r"has shape .* expected \(1, 2\)"):
            hf_tensor_source(HFShardReader(sharded), hf, dims, wanted=[])("embedding.word_embeddings.weight")
    finally:
        tables.expected_hf_shape = bad
