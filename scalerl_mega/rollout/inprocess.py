"""The local engine in the trainer's own process (`rollout.in_process=true`): one device for trainer and engine.

NCCL cannot connect two processes on the same GPU (it refuses duplicate devices), so the local engine's
process-and-broadcast design needs a second device. Here the `GenerationCore` (the local engine's batched
sampler, rollout/core.py) runs in the caller's process on the trainer's device, and a weight push is a copy:
the exported HF-named tensors (already on the device, in the generator dtype) are checked against the
model's names and shapes and copied in place (`GenerationCore.load_weights`: all-or-nothing), no process
group, no transfer.

Generation advances only inside `poll` (the loop's waits): while the trainer steps, the engine is idle, so
PipelineRL's overlap of generation and training does not exist here (the same device would be shared anyway).
Everything else follows `LocalRolloutEngine`: request ids and seeds (`make_requests`), pause modes, decode
counters (`decode_stats`) and the weights digest.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from scalerl_mega.interfaces import PAUSE_MODES
from scalerl_mega.rollout.core import GenerationCore
from scalerl_mega.rollout.local import LocalEngineConfig, build_model, make_requests, model_manifest
from scalerl_mega.weight_sync import SendStats, WeightSyncError, checked_update

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.types import Completion, Prompt, SamplingParams


class InProcessRolloutEngine:
    """`RolloutEngine` over a `GenerationCore` in this process (see module doc). `config.device` is the
    trainer's device ("cuda" = the current CUDA device); `num_threads`, `nice` and the process timeouts of
    `LocalEngineConfig` do not apply."""

    def __init__(self, config: LocalEngineConfig) -> None:
        self.config = config
        self.core = GenerationCore(build_model(config.model, device=config.device), config=config.core)
        self.version = 0
        self.paused = False
        self.last_sync_stats: SendStats | None = None
        self._manifest = model_manifest(config.model)
        self._done: list[Completion] = []

    # ---- RolloutEngine ---------------------------------------------------------------------------
    def submit(self, prompt: "Prompt", sampling: "SamplingParams", *, n: int, version: int,
               first_index: int = 0) -> None:
        for req in make_requests(prompt, sampling, n=n, version=version, base_seed=self.config.seed,
                                 first_index=first_index):
            self.core.add(req)

    def poll(self, timeout_s: float = 0.0) -> list["Completion"]:
        """Decode until a request finishes or `timeout_s` has passed (at least one step when there is work):
        the finished ones since the last call. Nothing is decoded while paused."""
        deadline = time.monotonic() + timeout_s
        while not self._done and not self.paused and self.core.can_progress():
            self._done += self.core.step()
            if time.monotonic() >= deadline:
                break
        out, self._done = self._done, []
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, version: int) -> None:
        """Copy HF-named weights into the model between decode steps (running requests keep their KV).
        The whole update is checked against the model's names and shapes first (`model_manifest`): a
        mismatch raises WeightSyncError naming the tensor and nothing is copied."""
        stats = SendStats(version=version)
        t0 = time.monotonic()
        try:
            counted = _counting(checked_update(named_tensors, self._manifest, version=version), stats)
            self.core.load_weights(counted)
        except ValueError as e:
            raise WeightSyncError(f"in-process engine rejected weight update v{version} ({e}); nothing was "
                                  f"applied, it keeps serving v{self.version}") from None
        self.core.set_version(version)
        if self.core.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.core.device)  # the push time includes the copies
        stats.seconds = time.monotonic() - t0
        self.last_sync_stats = stats
        self.version = version

    def update_adapter(self, adapter_config: dict[str, object], named_tensors: Iterable[tuple[str, "torch.Tensor"]], *,
                       version: int) -> None:
        """Serve the PEFT LoRA adapter `policy-v{version}` to requests admitted from now on (`GenerationCore.
        load_adapter`: running ones keep theirs). A bad adapter raises WeightSyncError naming the adapter and
        tensor; the previous version keeps serving. `last_sync_stats` counts the adapter's tensors and bytes."""
        stats = SendStats(version=version)
        t0 = time.monotonic()
        try:
            self.core.load_adapter(adapter_config, _counting(named_tensors, stats), version=version)
        except ValueError as e:
            raise WeightSyncError(f"in-process engine rejected {e}; it keeps serving v{self.version}") from None
        stats.seconds = time.monotonic() - t0
        self.last_sync_stats = stats
        self.version = version

    def pause(self, mode: str = "in_place") -> None:
        """Stop decoding. in_place keeps running requests and their KV; retract re-queues them (KV
        recomputed after resume); abort returns them at the next poll with finish reason ABORT."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode={mode!r} must be one of {PAUSE_MODES}")
        if mode == "abort":
            self._done += self.core.abort_all()
        elif mode == "retract":
            self.core.retract_all()
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def decode_stats(self) -> dict[str, float]:
        """`GenerationCore.stats()`: busy_s, decode_steps, decode_tokens, prefill_steps, prefill_tokens."""
        return self.core.stats()

    def weights_digest(self) -> dict[str, Any]:
        """`weight_sync.weights_sha256` of the weights the engine holds now, with their version."""
        from scalerl_mega.weight_sync import weights_sha256

        return {"weights_sha256": weights_sha256(self.core.model.named_parameters()), "version": self.core.version}

    def close(self) -> None:
        """Drop the model and its KV cache (the device memory returns to the caching allocator)."""
        self.core = None  # type: ignore[assignment]


def _counting(named_tensors: Iterable[tuple[str, "torch.Tensor"]], stats: SendStats
              ) -> Iterator[tuple[str, "torch.Tensor"]]:
    for name, t in named_tensors:
        stats.tensors += 1
        stats.bytes += t.numel() * t.element_size()
        yield name, t
