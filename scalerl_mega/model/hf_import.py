"""The trainer's model config from the `init_from_hf` checkpoint (`model=hf`), or checked against it.

    scalerl-train init_from_hf=/ckpt model=hf ...        # shapes come from /ckpt/config.json
    scalerl-train init_from_hf=/ckpt model=llama3_8b ... # the preset must match /ckpt/config.json

Both run at compose time (`resolve_model`, called from `compose.prepare`), before any model is
built, so a mismatch is reported before a size check such as "built only on GPU" could fire.

Supported `config.json` kinds (model/archs.py): Llama-3.x dense (`model_type: llama`, incl. `rope_scaling`
of type `llama3` and tied embeddings as in Llama-3.2-1B/3B and SmolLM2), Llama-4 text
(`model_type: llama4_text`), Qwen3 dense (`qwen3`: per-head q/k RMSNorm, tied embeddings in the small
ones) and Qwen3-MoE (`qwen3_moe`: softmax top-k routing, `norm_topk_prob`, `mlp_only_layers`). A multimodal Llama-4 `config.json` (`model_type: llama4`) carries its
text model under `text_config`; `hf_text_config` is the hook that unwraps it (loading its weights
is the converter's job, scalerl_mega/convert/).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config import TrainConfig
    from scalerl_mega.convert.dims import ArchDims
    from scalerl_mega.model.config import ModelConfig

HF_MODEL_NAME = "hf"
"""`model.name` of conf/model/hf.yaml: derive the model from `init_from_hf`'s config.json."""

REL_TOL = 1e-6
"""Floats compare with this relative tolerance: config.json files often carry float32-rounded
values (rms_norm_eps=9.999999747378752e-06 for 1e-5)."""

KEEP_FROM_COMPOSED = ("fp32_lm_head", "init_method_std")
"""`model.*` keys that `model=hf` keeps from the composed config (the precision group sets
fp32_lm_head); everything else comes from the checkpoint."""

ARCH_KEY = {  # ArchDims field -> the `model.*` key a user would override
    "arch": "model.arch", "hidden_size": "model.hidden_size", "num_layers": "model.num_layers",
    "num_heads": "model.num_attention_heads", "num_kv_heads": "model.num_query_groups",
    "head_dim": "model.head_dim", "ffn_hidden_size": "model.ffn_hidden_size", "vocab_size": "model.vocab_size",
    "tie_word_embeddings": "model.tie_embeddings", "rms_norm_eps": "model.norm_eps",
    "rope_theta": "model.rope_theta", "rope_scaling_factor": "model.rope_scaling / model.rope_scaling_factor",
    "max_position_embeddings": "model.max_position_embeddings", "num_experts": "model.num_experts",
    "moe_ffn_hidden_size": "model.moe_ffn_hidden_size", "moe_top_k": "model.moe_topk",
    "moe_layers": "model.moe_layer_freq / model.moe_dense_layers", "no_rope_layers": "model.no_rope_freq", "qk_l2_norm": "model.qk_l2_norm",
    "attention_chunk_size": "model.attention_chunk_size", "attn_temperature_tuning": "model.attn_temperature_tuning",
    "floor_scale": "model.floor_scale", "attn_scale": "model.attn_scale", "qk_layernorm": "model.qk_layernorm",
    "moe_norm_topk": "model.moe_router_pre_softmax (false = renormalised top-k, HF norm_topk_prob)",
}


def read_hf_config(path: str | Path, *, key: str = "init_from_hf") -> dict[str, Any]:
    """`<path>/config.json` as a dict; ValueError naming `key` when it is missing or unreadable."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise ValueError(f"{key}={str(path)!r}: no config.json there (expected a Hugging Face checkpoint dir)")
    try:
        cfg = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{key}={str(path)!r}: config.json is not readable JSON ({exc})") from exc
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{key}={str(path)!r}: config.json holds a JSON {type(cfg).__name__}, not an object")
    return cfg


def _readable_config(path: str | Path, *, key: str) -> Mapping[str, object]:
    """`read_hf_config`, refusing a quantization format the trainer cannot read (it reads blockwise FP8,
    dequantized on import: quant/checkpoint.py), so `--validate` names it before anything is built."""
    from scalerl_mega.quant.checkpoint import checkpoint_fp8_block

    cfg = read_hf_config(path, key=key)
    checkpoint_fp8_block(cfg, where=f"{key}={str(path)!r}: config.json")
    return cfg


_MULTIMODAL = {"llama4": "llama4_text", "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
"""Multimodal `model_type` -> the `model_type` of the text model it keeps under `text_config`."""


def hf_text_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decoder's config: multimodal Llama-4 (`model_type: llama4`) and Qwen3.5 (`qwen3_5`, `qwen3_5_moe`) keep
    it under `text_config` (their vision tower is not the trainer's)."""
    kind = cfg.get("model_type")
    if kind in _MULTIMODAL:
        if not isinstance(cfg.get("text_config"), Mapping):
            raise ValueError(f"config.json: model_type={kind!r} (multimodal) without a text_config object")
        text = {"model_type": _MULTIMODAL[kind], **cfg["text_config"]}
        text["model_type"] = _MULTIMODAL[kind]
        if "tie_word_embeddings" in cfg and "tie_word_embeddings" not in cfg["text_config"]:
            text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        return text
    return cfg


@contextlib.contextmanager
def _naming(key: str, path: str | Path):
    """ValueErrors raised inside name `<key>=<path>` (the one-line config error says which checkpoint)."""
    try:
        yield
    except ValueError as exc:
        if str(exc).startswith(f"{key}="):
            raise
        raise ValueError(f"{key}={str(path)!r}: {exc}") from exc


def model_from_hf_dir(path: str | Path, *, base: ModelConfig | None = None, key: str = "init_from_hf") -> ModelConfig:
    """Trainer `ModelConfig` equivalent to `<path>/config.json`; `base` (a ModelConfig) supplies the
    `KEEP_FROM_COMPOSED` keys. Raises ValueError naming `key` and the offending config.json field."""
    from scalerl_mega.convert.model_config import model_config_from_hf

    with _naming(key, path):
        cfg = hf_text_config(_readable_config(path, key=key))
        model = model_config_from_hf(cfg, name=HF_MODEL_NAME, where=f"{key}={str(path)!r}: config.json")
    if base is not None:
        model = dataclasses.replace(model, **{k: getattr(base, k) for k in KEEP_FROM_COMPOSED})
    return model.validate()


def _normalised(d):
    """Equivalent spellings made equal: a chunk as long as the context is plain causal attention;
    a dense Llama has no per-layer RoPE flags (ArchDims from a ModelConfig lists all-zero flags)."""
    chunk = d.attention_chunk_size
    if chunk and chunk >= d.max_position_embeddings:
        chunk = None
    flags = d.no_rope_layers if any(d.no_rope_layers) else ()
    return dataclasses.replace(d, attention_chunk_size=chunk, no_rope_layers=flags, rope_interleaved_in_hf=False)


def _same(a: object, b: object, *, rel_tol: float) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=0.0)
    return a == b


def _dims_diff(theirs: ArchDims, ours: ArchDims, *, rel_tol: float) -> list[tuple[str, object, object]]:
    theirs, ours = _normalised(theirs), _normalised(ours)
    return [(f.name, getattr(theirs, f.name), getattr(ours, f.name)) for f in dataclasses.fields(theirs)
            if not _same(getattr(theirs, f.name), getattr(ours, f.name), rel_tol=rel_tol)]


def model_mismatches(model: ModelConfig, hf_cfg: Mapping[str, Any], *, rel_tol: float = REL_TOL,
                     where: str = "config.json") -> list[str]:
    """Every architecture field where trainer `model` and HF `hf_cfg` differ, one line each:
    `<field>=<checkpoint value> in config.json but <model key>=<model value>` (floats: `rel_tol`)."""
    from scalerl_mega.convert.dims import dims_from_hf_config
    from scalerl_mega.convert.model_config import dims_from_model_config

    theirs = dims_from_hf_config(hf_text_config(hf_cfg), where=where)
    return [f"{name}={a!r} in {where} but {ARCH_KEY.get(name, 'model.' + name)} gives {b!r}"
            for name, a, b in _dims_diff(theirs, dims_from_model_config(model), rel_tol=rel_tol)]


def config_mismatches(theirs: Mapping[str, Any], ours: Mapping[str, Any], *, rel_tol: float = REL_TOL,
                      where: str = "config.json") -> list[str]:
    """Every architecture field where two HF config dicts differ (either may be a multimodal Llama-4
    file): `<field>=<value in theirs> in <where> but <value in ours> expected`."""
    from scalerl_mega.convert.dims import dims_from_hf_config

    a_dims = dims_from_hf_config(hf_text_config(theirs), where=where)
    b_dims = dims_from_hf_config(hf_text_config(ours), where="expected config")
    return [f"{name}={a!r} in {where} but {b!r} expected" for name, a, b in _dims_diff(a_dims, b_dims, rel_tol=rel_tol)]


def check_model_matches_hf(model: ModelConfig, path: str | Path, *, key: str = "init_from_hf") -> None:
    """ValueError listing every mismatching field when `model` cannot hold `<path>`'s weights."""
    with _naming(key, path):  # an unusable config.json (unsupported model_type, missing key, ...)
        bad = model_mismatches(model, _readable_config(path, key=key), where="config.json")
    if bad:
        raise ValueError(f"{key}={str(path)!r} does not match model '{model.name}' ({len(bad)} field(s)): "
                         + "; ".join(bad) + ". Use model=hf to take the shapes from the checkpoint, or fix model.*")


def resolve_model(config: TrainConfig) -> TrainConfig:
    """Compose-time step of `scalerl-train` (a TrainConfig in, the same object out).

    `model=hf` (model.name == 'hf'): `config.model` becomes the checkpoint's; needs `init_from_hf`.
    An explicit preset with `init_from_hf`: checked against the checkpoint, all mismatches at once.
    """
    path = str(getattr(config, "init_from_hf", "") or "")
    if config.model.name == HF_MODEL_NAME:
        if not path:
            raise ValueError("model=hf needs init_from_hf=<Hugging Face checkpoint dir> to read config.json from")
        config.model = model_from_hf_dir(path, base=config.model)
    elif path:
        check_model_matches_hf(config.model, path)
    return config
