"""One sample's /generate exchange: our `SamplingParams` -> SGLang `sampling_params`, and a response ->
output ids, log-probs, per-token weight versions and (MoE) decoded routes (see the package doc)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scalerl_mega.rollout.sglang.client import SGLangError
from scalerl_mega.types import FinishReason, Routes

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from scalerl_mega.types import SamplingParams


def sglang_sampling_params(sp: "SamplingParams", *, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
    """Our SamplingParams -> SGLang `sampling_params` (only keys SGLang accepts; unknown are rejected)."""
    return {
        "max_new_tokens": int(max_new_tokens if max_new_tokens is not None else sp.max_new_tokens),
        "temperature": float(sp.temperature),
        "top_p": float(sp.top_p),
        "stop_token_ids": [int(t) for t in sp.stop_token_ids],
        "sampling_seed": int(seed) % (1 << 63),
        "no_stop_trim": True,
    }


def parse_version(v: str | int | None, *, initial: int = 0) -> int:
    """SGLang weight versions are strings; ours are ints ("default" = the launch weights)."""
    if v is None or v == "default":
        return initial
    try:
        return int(v)
    except (TypeError, ValueError):
        raise SGLangError(f"weight version {v!r} is not an integer string") from None


def versions_per_token(meta: dict[str, Any], n: int, *, initial: int = 0) -> list[int]:
    """Expand meta_info.weight_versions spans ([start, end) over output tokens) to one per token."""
    spans = meta.get("weight_versions")
    if spans is None:
        return [parse_version(meta.get("weight_version"), initial=initial)] * n
    out: list[int | None] = [None] * n
    for s in spans:
        if not 0 <= s["start"] <= s["end"] <= n:
            raise SGLangError(f"weight_versions span {s} outside the {n} output tokens")
        for i in range(s["start"], s["end"]):
            out[i] = parse_version(s["version"], initial=initial)
    if any(v is None for v in out):
        raise SGLangError(f"weight_versions spans {spans} do not cover all {n} output tokens")
    return out  # type: ignore[return-value]


@dataclass
class GenerateResult:
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish: dict[str, Any]
    routed: Any = None
    """Decoded MoE expert ids, flat [input + output - 1, MoE layers, top-k] (`decode_routed_experts`)."""

    @property
    def finish_type(self) -> str:
        return self.finish.get("type", "") if self.finish else ""


@dataclass(frozen=True, kw_only=True)
class RouteLayout:
    """How to read `meta_info.routed_experts`: the HF model's layer count (SGLang's buffer has one
    column per hidden layer), its top-k, and the 0-based indices of its MoE layers (the columns kept,
    in this order: the trainer's route columns, `trainer/megatron/routing.py`)."""

    num_hidden_layers: int
    topk: int
    moe_layers: tuple[int, ...]
    num_experts: int = 0
    """Routed experts per MoE layer: ids are checked against it and kept as `route_id_dtype`
    (uint8 up to 256); 0: unknown (int32, unchecked)."""


def decode_routed_experts(b64: str, *, positions: int, layout: RouteLayout) -> "np.ndarray":
    """SGLang's base64 little-endian int32 [positions, num_hidden_layers, topk] routes -> the MoE
    layers' expert ids, a flat [positions, len(moe_layers), topk] numpy array of
    `route_id_dtype(layout.num_experts)` (decoded in numpy: no Python int per id)."""
    import base64

    import numpy as np

    from scalerl_mega.types import route_id_dtype

    raw = np.frombuffer(base64.b64decode(b64), dtype="<i4")
    per_pos = layout.num_hidden_layers * layout.topk
    if raw.size != positions * per_pos:
        raise SGLangError(f"meta_info.routed_experts has {raw.size} ids, expected {positions} positions x "
                          f"{layout.num_hidden_layers} layers x top-{layout.topk} = {positions * per_pos}")
    arr = raw.reshape(positions, layout.num_hidden_layers, layout.topk)[:, list(layout.moe_layers)]
    if layout.num_experts and arr.size and not 0 <= int(arr.min()) <= int(arr.max()) < layout.num_experts:
        raise SGLangError(f"meta_info.routed_experts has expert ids in [{arr.min()}, {arr.max()}], outside "
                          f"0..{layout.num_experts - 1} (num_experts={layout.num_experts}): a different model?")
    return arr.astype(route_id_dtype(layout.num_experts)).ravel()


def parse_generate_response(body: dict[str, Any], *, initial_version: int = 0, routes: RouteLayout | None = None,
                            input_len: int = 0) -> GenerateResult:
    """Pull output ids, output_token_logprobs ([logprob, token_id, text]), finish_reason and the
    per-token weight versions out of one /generate response object; with `routes`, also the decoded
    `meta_info.routed_experts` of the `input_len` + output - 1 positions."""
    meta = body.get("meta_info") or {}
    ids = body.get("output_ids")
    lps = meta.get("output_token_logprobs")
    if ids is None or lps is None:
        raise SGLangError("generate response lacks output_ids or meta_info.output_token_logprobs")
    if [int(e[1]) for e in lps] != list(ids):
        raise SGLangError("output_token_logprobs token ids disagree with output_ids")
    routed = None
    if routes is not None:
        if not meta.get("routed_experts"):
            raise SGLangError("generate response lacks meta_info.routed_experts (requested with "
                              "return_routed_experts): launch the server with --enable-return-routed-experts")
        routed = decode_routed_experts(meta["routed_experts"], positions=input_len + len(ids) - 1, layout=routes)
    return GenerateResult(
        output_ids=list(ids),
        logprobs=[float(e[0]) for e in lps],
        versions=versions_per_token(meta, len(ids), initial=initial_version),
        finish=meta.get("finish_reason") or {},
        routed=routed,
    )


def completion_routes(ids: "np.ndarray", layout: RouteLayout, *, prompt_len: int, versions: list[int], initial: int) -> Routes:
    """`Routes` (ids only) of prompt_len + len(versions) - 1 positions: prompt positions before the last
    one get the first output token's version (the prefill's), position prompt_len - 1 + j the version
    of output token j."""
    first = versions[0] if versions else initial
    return Routes(num_layers=len(layout.moe_layers), topk=layout.topk, expert_ids=ids, weights=[],
                  versions=[first] * (prompt_len - 1) + list(versions))


def finish_reason(kind: str) -> FinishReason:
    return {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}.get(
        kind, FinishReason.ABORT
    )
