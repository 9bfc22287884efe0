"""The seams between components (DESIGN.md "Seams"). Each has a real CPU implementation.

Protocols only: no implementation and no heavy imports here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.types import Completion, Prompt, SamplingParams, TrainBatch


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions; receives new weights in flight (PipelineRL) or between phases."""

    def submit(self, prompt: "Prompt", sampling: "SamplingParams", *, n: int, version: int) -> None:
        """Queue `n` samples of `prompt`; `version` is the trainer step at admission."""

    def poll(self, timeout_s: float = 0.0) -> list["Completion"]:
        """Return the completions finished since the last call (waits up to `timeout_s`)."""

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, version: int) -> None:
        """Apply HF-named weights; generation continues with the new weights (stale KV kept)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class PolicyTrainer(Protocol):
    """Trains the policy (Megatron-Core on CPU and GPU)."""

    def train_step(self, batch: "TrainBatch") -> dict[str, float]:
        """One optimizer step on `batch`; returns metrics (loss, grad_norm, ...)."""

    def export_hf_weights(self) -> Iterator[tuple[str, "torch.Tensor"]]:
        """HF-named full tensors, deterministic order, bounded memory."""

    def save(self, path: str, *, extra_state: dict[str, Any] | None = None) -> None: ...

    def load(self, path: str) -> dict[str, Any]:
        """Load model + optimizer; return the extra state saved with them."""


@runtime_checkable
class RewardFn(Protocol):
    """Scores completions (batched; implementations run a worker pool with timeouts)."""

    def __call__(self, prompts: list["Prompt"], texts: list[str]) -> list[tuple[float, bool, str]]:
        """Return (reward, passed, reason) per completion."""


@runtime_checkable
class WeightSender(Protocol):
    def send(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, version: int) -> None: ...


@runtime_checkable
class WeightReceiver(Protocol):
    def receive(self) -> tuple[int, list[tuple[str, "torch.Tensor"]]]: ...
