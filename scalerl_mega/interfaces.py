"""The seams between components. Each has a real CPU implementation.

Protocols only: no implementation and no heavy imports here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.scaling.forecast import Forecast
    from scalerl_mega.types import Completion, Prompt, SamplingParams, TrainBatch

PAUSE_MODES = ("in_place", "retract", "abort")
"""How an engine holds its requests across a weight update (SGLang's /pause_generation modes, followed by the
local engine): keep them and their KV cache (in_place, PipelineRL), retract them to be re-prefilled, or abort
them. `config.pause_mode` picks one per off-policy setup."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions; receives new weights in flight (PipelineRL) or between phases."""

    def submit(self, prompt: "Prompt", sampling: "SamplingParams", *, n: int, version: int,
               first_index: int = 0) -> None:
        """Queue `n` samples of `prompt`, indices `first_index` .. `first_index + n - 1` of its group (each
        comes back as a Completion with that `sample_index`); `version` is the trainer step at admission."""

    def poll(self, timeout_s: float = 0.0) -> list["Completion"]:
        """Return the completions finished since the last call (waits up to `timeout_s`)."""

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, version: int) -> None:
        """Apply HF-named weights; generation continues with the new weights (stale KV kept)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class AdapterEngine(Protocol):
    """The optional LoRA capability of a `RolloutEngine` (the local engines, SGLang, `build.EngineSet`): it
    serves PEFT LoRA adapters on its base model, so a step's sync sends the adapter alone."""

    def update_adapter(self, adapter_config: dict[str, object], named_tensors: Iterable[tuple[str, "torch.Tensor"]], *,
                       version: int) -> None:
        """Serve the PEFT 0.21 adapter (`adapter_config.json` as a dict; tensors
        `base_model.model.<module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r]) as `policy-v{version}`
        to requests started from now on; a request keeps the adapter it started with, and a version is dropped
        once no request uses it. A bad adapter raises WeightSyncError naming the adapter and tensor, and the
        previous version keeps serving."""


@runtime_checkable
class PolicyTrainer(Protocol):
    """Trains the policy (Megatron-Core on CPU and GPU)."""

    def train_step(self, batch: "TrainBatch") -> dict[str, float]:
        """One optimizer step on `batch` (the global batch; a multi-rank trainer trains each
        data-parallel shard on its rank); returns the global metrics (loss, grad_norm, ...)."""

    def export_hf_weights(self, *, dtype: str | None = None) -> Iterator[tuple[str, "torch.Tensor"]]:
        """HF-named full tensors on the training device, cast to `dtype` (the generator's, e.g.
        "bfloat16"; None keeps the training dtype), deterministic order, bounded memory."""

    def save(self, path: str, *, step: int | None = None, extra_state: dict[str, Any] | None = None) -> None:
        """Collectively save model + optimizer + `extra_state` under root `path` as checkpoint `step`: the
        loop's step (a step whose groups were all filtered out takes no optimizer step, so the trainer's own
        count can lag it); None: the trainer's optimizer-step count."""

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


@runtime_checkable
class PromptSampler(Protocol):
    """The curriculum seam the loop needs (data/curriculum.py implements it)."""

    def next_prompts(self, n: int) -> list["Prompt"]: ...

    def record(self, prompt_id: str, pass_rate: float) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Forecaster(Protocol):
    """The live forecast the loop feeds one validation point at a time (train.AutoBudgetForecaster implements
    it): a Forecast once it has enough points, else None; `unit` names the compute axis in its console line."""

    unit: str

    def add(self, compute: float, reward: float, n_samples: float | None = None, *,
            step: float | None = None) -> "Forecast | None": ...


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer that the data pipeline uses (the synthetic task's character tokenizer
    has it too): `tok(text)["input_ids"]`, the chat template when there is one, the end-of-sequence id."""

    eos_token_id: int | None

    def __call__(self, text: str, **kwargs: Any) -> Any: ...

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...

    def decode(self, ids: list[int], **kwargs: Any) -> str: ...


@dataclass(kw_only=True)
class LoopComponents:
    """Everything the RL loop (loop.py) drives; built by build.py from the config on the controller
    rank (trainer/ranks.py)."""

    engine: RolloutEngine
    trainer: PolicyTrainer
    reward_fn: RewardFn | Callable[[list["Prompt"], list[str]], list[tuple[float, bool, str]]]
    sampler: PromptSampler
    val_prompts: list["Prompt"]
    decode: Callable[[list[int]], str]
    """Token ids -> text for scoring (used when the engine does not fill Completion.text)."""
    encode: Callable[[str], list[int]]
    stop_token_ids: list[int]
    interruption_ids: list[int] = field(default_factory=list)
    weight_dtype: str | None = None
    """dtype the generators hold their weights in ("bfloat16", "float32"; "bfloat16+fp32_head" keeps an
    FP32 LM head FP32, `export.weight_dtypes`): exports are cast to it on the training device before
    they are sent. None keeps the trainer's dtype."""
    adapter_sync: bool = False
    """`peft=lora`: each step's push sends the trainer's LoRA adapter alone (`trainer.export_adapter` ->
    `engine.update_adapter`, `AdapterEngine`); the base weights travel once, at the loop's first push."""
    sync_weights: Callable[..., dict[str, float]] | None = None
    """The per-stage weight push (`rollout.weight_sync_senders=per_stage`: `ranks.ControllerTrainer.sync_weights`,
    called as (engine, version=, dtype=) and returning the `sync/*` metrics); None: the one-sender push
    (`engine.update_weights(trainer.export_hf_weights())`)."""
