"""Which HF checkpoint layout a directory holds, and the tensor-name prefix of its text model.

Two layouts carry a Llama-4 text model:

- ``causal``: ``Llama4ForCausalLM`` (``model_type`` ``llama4_text``), and the only layout of every
  other architecture (``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``; model/archs.py):
  text tensors at the top level (``model.layers.0...``, ``lm_head.weight``).
- ``conditional``: ``Llama4ForConditionalGeneration``, the multimodal checkpoint Meta publishes
  (``model_type`` ``llama4``, the text config under ``text_config``); text tensors under
  ``language_model.``, the vision tower under ``vision_model.`` and ``multi_modal_projector.``.

Qwen3.5 / Qwen3.5-MoE publish the same two ways: ``Qwen3_5(Moe)ForCausalLM`` (``qwen3_5_text`` /
``qwen3_5_moe_text``, causal) and the multimodal ``Qwen3_5(Moe)ForConditionalGeneration`` (``qwen3_5`` /
``qwen3_5_moe``, conditional): text tensors under ``model.language_model.`` (the head stays ``lm_head.``), the
vision tower under ``model.visual.``, carried unchanged like Llama-4's. The multi-token-prediction weights of
Qwen3-Next and Qwen3.5 (``mtp.*``) are carried the same way in either layout.

The converter tables name text tensors as in the causal layout; ``HFLayout.hf_name`` adds the prefix.
SGLang 0.5.23 loads Llama-4 through ``mllama4.Llama4ForConditionalGeneration.load_weights``
(``language_model.`` prefix, fused ``experts.gate_up_proj``/``down_proj``, q/k rows permuted from
complex pairs to rotate-half); its text-only ``Llama4ForCausalLM`` inherits
``LlamaForCausalLM.load_weights``, which has no mapping for the fused expert tensors (they are
skipped with "not found in params_dict") and does not permute q/k. So only the conditional layout
serves a Llama-4 MoE model correctly there (``sglang_warnings``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Mapping

from scalerl_mega.jsonvalue import JSON

CAUSAL, CONDITIONAL = "causal", "conditional"
LAYOUTS = (CAUSAL, CONDITIONAL)
TEXT_PREFIX = "language_model."
NON_TEXT_PREFIXES = ("vision_model.", "multi_modal_projector.")
QWEN_VL = {"qwen3_5": ("qwen3_5_text", "Qwen3_5ForConditionalGeneration"),
           "qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForConditionalGeneration")}
"""Multimodal Qwen3.5 `model_type` -> (its text model's `model_type`, its class)."""
QWEN_VL_TEXT, QWEN_VL_NON_TEXT, MTP_PREFIX = "model.language_model.", ("model.visual.",), "mtp."
_MTP_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


@dataclasses.dataclass(frozen=True)
class HFLayout:
    """The layout of one HF checkpoint: ``kind`` and the full ``config.json`` dict."""

    kind: str
    config: Mapping[str, JSON]

    @property
    def text_config(self) -> dict[str, JSON]:
        return dict(self.config["text_config"]) if self.kind == CONDITIONAL else dict(self.config)

    @property
    def qwen_vl(self) -> bool:
        return self.kind == CONDITIONAL and self.config.get("model_type") in QWEN_VL

    @property
    def prefix(self) -> str:
        """Llama-4's text prefix (a Qwen3.5 conditional checkpoint maps `model.` only: `hf_name`)."""
        return TEXT_PREFIX if self.kind == CONDITIONAL and not self.qwen_vl else ""

    def hf_name(self, text_name: str) -> str:
        if self.qwen_vl:
            return QWEN_VL_TEXT + text_name[len("model."):] if text_name.startswith("model.") else text_name
        return self.prefix + text_name

    def is_non_text(self, name: str) -> bool:
        """Tensors outside the decoder the trainer builds: a conditional checkpoint's vision tower, and
        DeepSeek-V3's multi-token-prediction layers (`model.layers.{i}` for i >= num_hidden_layers, i.e.
        `num_nextn_predict_layers`), which RL does not need: skipped on load, carried unchanged into the
        converter checkpoint and written back on export."""
        if self.qwen_vl:
            return name.startswith((*QWEN_VL_NON_TEXT, MTP_PREFIX))
        if self.kind == CONDITIONAL:
            return name.startswith(NON_TEXT_PREFIXES)
        if self.config.get("model_type") in _MTP_TYPES:
            return name.startswith(MTP_PREFIX)
        return self.config.get("model_type") == "deepseek_v3" and is_mtp_layer(name, self.config)

    def carries_non_text(self) -> bool:
        """Whether an export in this layout writes the non-text tensors back."""
        return self.kind == CONDITIONAL or self.config.get("model_type") in ("deepseek_v3", *_MTP_TYPES)


_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


def is_mtp_layer(name: str, cfg: Mapping[str, JSON]) -> bool:
    m = _LAYER_INDEX.match(name)
    return bool(m) and int(m.group(1)) >= int(cfg.get("num_hidden_layers", 0))


def layout_of_config(cfg: Mapping[str, JSON], *, where: str = "config.json") -> HFLayout:
    """Detect the layout from a ``config.json`` dict (ValueError naming the key otherwise)."""
    if cfg.get("model_type") in QWEN_VL:
        text = cfg.get("text_config")
        if not isinstance(text, Mapping):
            raise ValueError(f"{where}: model_type={cfg['model_type']!r} (multimodal Qwen3.5) without a text_config")
        tie = {"tie_word_embeddings": cfg["tie_word_embeddings"]} if "tie_word_embeddings" in cfg else {}
        return HFLayout(CONDITIONAL, {**cfg, "text_config": {**tie, **text, "model_type": QWEN_VL[cfg["model_type"]][0]}})
    if cfg.get("model_type") != "llama4":
        return HFLayout(CAUSAL, dict(cfg))
    text = cfg.get("text_config")
    if not isinstance(text, Mapping):
        raise ValueError(f"{where}: model_type='llama4' (Llama4ForConditionalGeneration) without a text_config")
    if text.get("model_type", "llama4_text") != "llama4_text":
        raise ValueError(f"{where}: text_config.model_type={text.get('model_type')!r}, expected 'llama4_text'")
    return HFLayout(CONDITIONAL, {**cfg, "text_config": {**text, "model_type": "llama4_text"}})


def read_layout(hf_dir: str) -> HFLayout:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"{hf_dir}: config.json is missing")
    with open(path) as f:
        return layout_of_config(json.load(f), where=path)


def output_config(kind: str, text_config: Mapping[str, JSON], *, source: Mapping[str, JSON] | None = None) -> dict[str, JSON]:
    """``config.json`` for writing ``text_config``'s model in layout ``kind``. ``source`` (a
    conditional config, e.g. the one converted from) supplies the vision config and token ids;
    without it transformers' defaults apply to the vision tower."""
    text = dict(text_config)
    if kind == CAUSAL:
        from scalerl_mega.model.archs import arch_of_model_type

        return {**text, "architectures": [arch_of_model_type(text.get("model_type")).causal_lm]}
    if kind != CONDITIONAL:
        raise ValueError(f"layout={kind!r}: expected one of {LAYOUTS}")
    vl = {t: (mm, cls) for mm, (t, cls) in QWEN_VL.items()}
    if text.get("model_type") in vl:
        mm, cls = vl[text["model_type"]]
        base = dict(source) if source and source.get("model_type") == mm else {}
        text.pop("architectures", None)
        return {**base, "architectures": [cls], "model_type": mm, "text_config": text,
                "tie_word_embeddings": bool(text.get("tie_word_embeddings", False))}
    if text.get("model_type") != "llama4_text":
        raise ValueError(f"layout='conditional' is Llama-4 and Qwen3.5 only; the model is model_type="
                         f"{text.get('model_type')!r}")
    base = dict(source) if source and source.get("model_type") == "llama4" else {}
    text.pop("architectures", None)
    return {**base, "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text,
            "tie_word_embeddings": bool(text.get("tie_word_embeddings", False))}


# SGLang 0.5.23's stacked-parameter rules (checkpoint substring -> fused parameter), in its order.
_SGLANG_STACKED = {
    CONDITIONAL: ((".self_attn.q_proj", ".self_attn.qkv_proj"), (".self_attn.k_proj", ".self_attn.qkv_proj"),
                  (".self_attn.v_proj", ".self_attn.qkv_proj"),
                  (".shared_expert.gate_proj", ".shared_expert.gate_up_proj"),
                  (".shared_expert.up_proj", ".shared_expert.gate_up_proj"),
                  (".feed_forward.gate_proj", ".feed_forward.gate_up_proj"),
                  (".feed_forward.up_proj", ".feed_forward.gate_up_proj")),
    CAUSAL: ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
             (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj")),
}
_FUSED_EXPERTS = {".experts.gate_up_proj": ".experts.w13_weight", ".experts.down_proj": ".experts.w2_weight"}


def sglang_llama4_target(name: str, *, kind: str) -> str | None:
    """The SGLang 0.5.23 parameter that checkpoint tensor ``name`` of a Llama-4 text model loads
    into, or None when SGLang skips it. ``kind``: the checkpoint layout, which picks SGLang's
    loader (conditional: ``mllama4.Llama4ForConditionalGeneration.load_weights``, which adds the
    ``language_model.`` prefix and maps the fused experts; causal: ``Llama4ForCausalLM``, i.e.
    ``LlamaForCausalLM.load_weights``, which skips names it has no parameter for). Non-text
    (vision) tensors are out of scope (None)."""
    if name.startswith(NON_TEXT_PREFIXES):
        return None
    if kind == CONDITIONAL and not name.startswith(TEXT_PREFIX):
        name = TEXT_PREFIX + name
    for ckpt, param in _SGLANG_STACKED[kind]:
        if ckpt in name:
            return name.replace(ckpt, param)
    for ckpt, param in _FUSED_EXPERTS.items():
        if name.endswith(ckpt):
            return name.replace(ckpt, param) if kind == CONDITIONAL else None
    return name


_SGLANG_EXPERT = re.compile(r"\.experts\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.")
_SGLANG_SHARDS = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
                  "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def sglang_qwen3_target(name: str) -> tuple[str, str | int | None, int | None]:
    """(parameter, shard, expert) that checkpoint tensor ``name`` of a Qwen3 / Qwen3-MoE model loads
    into in SGLang 0.5.23 (``qwen3.py`` / ``qwen3_moe.py`` ``load_weights``): q/k/v -> ``qkv_proj`` shards
    q/k/v and a dense MLP's gate/up -> ``gate_up_proj`` shards 0/1; routed expert e's gate/up/down ->
    ``experts.w13_weight`` shards w1/w3 and ``experts.w2_weight`` shard w2 of expert e
    (``FusedMoE.make_expert_params_mapping``); every other name (q/k norms, ``mlp.gate`` router, norms,
    embedding, head) loads under its own name."""
    m = _SGLANG_EXPERT.search(name)
    if m:
        param = "w13_weight" if m["proj"] in ("gate", "up") else "w2_weight"
        return name[:m.start()] + ".experts." + param, {"gate": "w1", "up": "w3", "down": "w2"}[m["proj"]], int(m["e"])
    for ckpt, (param, shard) in _SGLANG_SHARDS.items():
        if ckpt in name:
            return name.replace(ckpt, param), shard, None
    return name, None, None


def sglang_warnings(kind: str, text_config: Mapping[str, JSON], names: list[str] | None = None) -> list[str]:
    """Why SGLang 0.5.23 would serve this export wrongly (empty: none known). ``names``: the exported
    text tensors in causal-layout naming."""
    if text_config.get("model_type") == "qwen3_moe":
        out = []
        if text_config.get("tie_word_embeddings"):
            out.append("tied embeddings: SGLang 0.5.23's Qwen3MoeForCausalLM keeps its own lm_head and never loads "
                       "it from model.embed_tokens.weight (its load_weights has no tie), so it would serve an "
                       "untrained head")
        if text_config.get("mlp_only_layers") or int(text_config.get("decoder_sparse_step") or 1) != 1:
            out.append(f"dense layers (mlp_only_layers={list(text_config.get('mlp_only_layers') or [])}, "
                       f"decoder_sparse_step={text_config.get('decoder_sparse_step')}): SGLang 0.5.23's "
                       "Qwen3MoeDecoderLayer makes every layer sparse (stage_facts), skips the dense MLP weights and "
                       "would serve those layers with untrained experts")
        return out
    if kind != CAUSAL or text_config.get("model_type") != "llama4_text":
        return []
    skipped = [n for n in names or () if sglang_llama4_target(n, kind=CAUSAL) is None]
    what = f"skips the {len(skipped)} fused expert tensors (e.g. {skipped[0]!r}) and " if skipped else ""
    return [f"text-only Llama4ForCausalLM layout: SGLang 0.5.23 loads it with LlamaForCausalLM.load_weights, which "
            f"{what}does not permute q/k rows to its rotate-half RoPE; write --layout conditional "
            "(Llama4ForConditionalGeneration, served by SGLang's mllama4 loader)"]


_SGLANG_DS_STACKED = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
                      "q_a_proj": ("fused_qkv_a_proj_with_mqa", 0), "kv_a_proj_with_mqa": ("fused_qkv_a_proj_with_mqa", 1)}


def sglang_deepseek_v3_target(name: str, cfg: Mapping[str, JSON]) -> tuple[str, str | int | None, int | None] | None:
    """(parameter, shard, expert) that checkpoint tensor ``name`` of a DeepSeek-V3 model loads into in SGLang 0.5.23
    (`deepseek_common/deepseek_weight_loader.py`, speculative decoding off), or None when it skips it: the MTP layers
    (`model.layers.{i >= num_hidden_layers}`). Routed expert e's gate/up/down -> `experts.w13_weight` w1/w3 and
    `experts.w2_weight` w2 of expert e; dense and shared-expert gate/up -> `gate_up_proj` 0/1; with a q_lora_rank,
    `q_a_proj` and `kv_a_proj_with_mqa` -> `fused_qkv_a_proj_with_mqa` 0/1 (concatenated rows); everything else,
    the router's `e_score_correction_bias` included, loads under its own name."""
    if is_mtp_layer(name, cfg):
        return None
    m = _SGLANG_EXPERT.search(name)
    if m:
        param = "w13_weight" if m["proj"] in ("gate", "up") else "w2_weight"
        return name[:m.start()] + ".experts." + param, {"gate": "w1", "up": "w3", "down": "w2"}[m["proj"]], int(m["e"])
    for ckpt, (param, shard) in _SGLANG_DS_STACKED.items():
        if f".{ckpt}.weight" in name and (ckpt not in ("q_a_proj", "kv_a_proj_with_mqa") or cfg.get("q_lora_rank")):
            return name.replace(ckpt, param), shard, None
    return name, None, None
