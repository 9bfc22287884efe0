"""The records of one agent-endpoint call: what the endpoint asks the engine for, what it
gets back, and what it keeps per episode for stitching (`episodes/stitch.py`).

Plain keyword-only dataclasses of Python lists (they cross threads and processes); only `types` and
`jsonvalue` are imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scalerl_mega.jsonvalue import JSON
from scalerl_mega.types import FinishReason, Routes, SamplingParams


@dataclass(kw_only=True, slots=True)
class GenerateRequest:
    """One chat-completions call as exact ids: the whole templated conversation so far (`prompt_ids`,
    the previous calls' ids included when the call extends them) and the sampling parameters."""

    prompt_ids: list[int]
    sampling: SamplingParams
    episode_id: str


@dataclass(kw_only=True, slots=True)
class GenerateResult:
    """The engine's answer to a `GenerateRequest`: one entry per generated id in each list."""

    output_ids: list[int]
    gen_logprobs: list[float]
    weight_versions: list[int]
    finish_reason: FinishReason
    routes: Routes | None = None

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.gen_logprobs) != n or len(self.weight_versions) != n:
            raise ValueError(f"GenerateResult: {n} output ids but {len(self.gen_logprobs)} log-probs and "
                             f"{len(self.weight_versions)} weight versions (one each per output id)")


@dataclass(kw_only=True, slots=True)
class RecordedCall:
    """One served call of an episode, in the order the calls finished: the exact ids sent to the engine and
    the engine's generated ids with their log-probs, weight versions and (MoE) routes."""

    prompt_ids: list[int]
    output_ids: list[int]
    gen_logprobs: list[float]
    weight_versions: list[int]
    finish_reason: FinishReason
    routes: Routes | None = None
    messages: list[dict[str, JSON]] = field(default_factory=list)
    """The call's chat messages and the assistant's reply as decoded from its generated ids (template form)."""
    unknown_ids: int = 0
    """Ids of the tokenizer's unknown id among those the endpoint templated for this call (the whole prompt when
    templated afresh, else the new messages' span): characters the vocabulary lacks (episodes/coverage.py)."""
    seen: str = ""
    """Those templated ids as the model sees them (decoded, special tokens kept)."""

    @classmethod
    def of(cls, request: GenerateRequest, result: GenerateResult) -> "RecordedCall":
        return cls(prompt_ids=list(request.prompt_ids), output_ids=list(result.output_ids),
                   gen_logprobs=list(result.gen_logprobs), weight_versions=list(result.weight_versions),
                   finish_reason=result.finish_reason, routes=result.routes)
