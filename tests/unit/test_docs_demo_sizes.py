"""The sizes the docs and configs state for the CPU demo's models and tokenizer are the true ones: every
"~N.NM parameters" in the tracked docs, configs and tools is the parameter count of the model it describes (counted
on the Hugging Face model the local engine builds), every "N-token tokenizer / vocabulary" is the synthetic
task's tokenizer's length, and the tiny-checkpoint tool's architectures are the ones the docs list."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARAMS = re.compile(r"(\d+\.\d+)M[-\s#]*param")
TOKENS = re.compile(r"(\d+)[- ]token[^.;|\n]{0,40}?(?:tokenizer|vocabulary)|\((\d+) tokens in all\)")

# file -> the model its "N.NM param..." figure describes: a preset under conf/model/, or the bench model
DESCRIBES = {
    "conf/model/demo_moe.yaml": "demo_moe",
    "conf/experiment/demo.yaml": "demo_moe",
    "conf/experiment/demo_multiturn.yaml": "demo_moe",
    "docs/running_scalerl.md": "demo_moe",
    "reproduction/loo/README.md": "demo_moe",
    "conf/model/demo_dense.yaml": "demo_dense",
    "bench/generate.py": "bench_generate",
    "docs/cluster_and_gpu.md": "bench_generate",  # `bench/generate.py` (1.06M-param model, ...)
}


def _tracked_texts() -> dict[str, str]:
    """The tracked text files outside tests/ (tests assert figures in code)."""
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for name in names:
        if name.startswith("tests/") or not name.endswith((".md", ".py", ".yaml", ".sh", ".toml", ".txt")):
            continue
        try:
            out[name] = (REPO / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
    return out


def _hf_param_count(preset: str) -> int:
    """Parameters of the `transformers` model of a preset (the local engine's model), counted tensor by tensor."""
    import transformers

    from scalerl_mega.model.archs import arch_of
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_export import hf_config_from_model

    import torch

    name, kwargs = hf_config_from_model(load_model_preset(preset))
    record = arch_of(name)
    with torch.device("meta"):  # shapes only: no initialisation
        model = getattr(transformers, record.causal_lm)(getattr(transformers, record.config_class)(**kwargs))
    return sum(p.numel() for p in model.parameters())


def test_demo_parameter_counts_by_hand():
    """demo_moe: 4 layers of attention (q 128x128, k/v 128x64 each for 2 KV groups of 32, o 128x128, two norms)
    and a MoE block (router 128x4, 4 SwiGLU experts of 64, a shared one of 64), a 48 x 128 embedding and an untied
    output layer, the final norm; demo_dense: the same attention and a SwiGLU MLP of 256."""
    from scalerl_mega.model.config import load_model_preset

    h, v = 128, 48
    attn = h * h + 2 * h * 64 + h * h + 2 * h
    moe = h * 4 + 4 * 3 * h * 64 + 3 * h * 64
    embed = 2 * v * h + h
    assert _hf_param_count("demo_moe") == load_model_preset("demo_moe").num_params()["total"] == \
        4 * (attn + moe) + embed == 703_616
    assert _hf_param_count("demo_dense") == 4 * (attn + 3 * h * 256) + embed == 603_264


def test_every_stated_parameter_figure_is_its_models_count():
    counts = {"demo_moe": 703_616, "demo_dense": 603_264,
              # bench/generate.py's model: 4 layers of full-head attention (4 x 128^2) and a SwiGLU of 512,
              # 24-id embedding and output layer, final norm
              "bench_generate": 4 * (4 * 128 * 128 + 3 * 128 * 512 + 2 * 128) + 2 * 24 * 128 + 128}
    assert counts["bench_generate"] == 1_055_872
    found = []
    for name, text in _tracked_texts().items():
        for m in PARAMS.finditer(text):
            assert name in DESCRIBES, f"{name}: {m.group(0)!r} describes a model this test does not know"
            found.append((name, float(m.group(1)), round(counts[DESCRIBES[name]] / 1e6, 2)))
    assert {n for n, *_ in found} == set(DESCRIBES)
    for name, stated, true in found:  # stated to 1 or 2 decimals: the true count rounded as many
        decimals = len(str(stated).split(".")[1])
        assert stated == round(true, decimals), (name, stated, true)


def test_every_stated_tokenizer_size_is_the_synthetic_tokenizers():
    pytest.importorskip("tokenizers")
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    n = len(build_arith_tokenizer())
    assert n == 47
    stated = [(name, int(m.group(1) or m.group(2))) for name, text in _tracked_texts().items()
              for m in TOKENS.finditer(text)]
    assert len(stated) >= 6 and {s for _, s in stated} == {n}, stated


def test_the_docs_name_every_tiny_checkpoint_architecture():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mtc", REPO / "tools" / "make_tiny_checkpoint.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    m = re.search(r"`--list` names them: ([a-z0-9_, ]+)\)", (REPO / "docs" / "extending.md").read_text())
    assert m and m.group(1).split(", ") == list(tool.TINY), m
