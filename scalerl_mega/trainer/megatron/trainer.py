"""`MegatronPolicyTrainer`: the PolicyTrainer seam (interfaces.py) on Megatron-Core, CPU and GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Optional

from scalerl_mega.model.config import MegatronConfig, OptimConfig
from scalerl_mega.trainer.megatron.step import HeadLossFn, LossFn, next_token_ce_loss
from scalerl_mega.trainer.microbatch import MicroBatchPlan
from scalerl_mega.trainer.policy_loss import batch_tensors, finalize_train_metrics
from scalerl_mega.types import SftBatch, TrainBatch

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

    from scalerl_mega.trainer.megatron.routing import RouteTracker


class MegatronPolicyTrainer:
    """Builds process groups, model, DDP and optimizer from a validated `MegatronConfig`.

    `loss_fn(logp_BT, mb) -> (loss, metrics)` (see step.py for the normalisation contract);
    the default is next-token cross-entropy. `head_loss_fn(LMHead, mb) -> (loss, metrics)`, if given,
    replaces it in training steps: the output layer is skipped and the loss computes the FP32 head
    itself without [N, V] logits (e.g. fused CISPO); `logprobs` keeps the logits path.
    `micro_batch_tokens`: split each step's rows into micro-batches by this token budget instead of
    `cfg.parallel.micro_batch_size` rows (RL batches have a variable number of rows), for batches that
    do not carry their own plan (a TrainBatch from `batch.build_train_batch` does). `pack_sequences`:
    plan such batches with several samples per packed row.
    Construct inside `if __name__ == "__main__":` (checkpoint saves spawn a multiprocessing Manager).
    """

    def __init__(self, cfg: MegatronConfig, *, loss_fn: LossFn = next_token_ce_loss,
                 head_loss_fn: HeadLossFn | None = None, micro_batch_tokens: int | None = None,
                 pack_sequences: bool = False) -> None:
        from scalerl_mega.trainer.megatron import models, parallel, step, wrap

        cfg.validate(world_size=parallel.world_size_from_env())  # before any process group starts
        self.cfg = cfg
        if micro_batch_tokens is not None and micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens={micro_batch_tokens} must be >= 1")
        self.loss_fn = loss_fn
        self.head_loss_fn = head_loss_fn
        self.micro_batch_tokens = micro_batch_tokens
        self.pack_sequences = bool(pack_sequences)
        if pack_sequences and cfg.model.arch == "llama4" and cfg.model.llama4_features():
            raise ValueError(f"train.pack_sequences=true with model '{cfg.model.name}': its Llama-4 attention "
                             f"({cfg.model.llama4_features()[0]}) takes no per-sample mask")
        self.info = parallel.init_parallel(cfg.parallel, model=cfg.model, seed=cfg.optim.seed)
        model, self.tcfg = models.build_model(cfg.model, cfg.parallel, params_dtype=cfg.params_dtype,
                                              recompute=cfg.recompute)
        self.peft = cfg.peft if cfg.peft is not None and cfg.peft.kind == "lora" else None
        """`peft=lora`: the base model frozen and LoRA adapters trained (trainer/megatron/lora.py), else None."""
        if self.peft is not None:  # before DDP and the optimizer: no grad buffers, no state for the base
            from scalerl_mega.trainer.megatron import lora

            lora.inject_lora(model, self.peft, num_experts=cfg.model.num_experts, seed=cfg.optim.seed)
        from scalerl_mega.trainer.megatron.lora_ckpt import random_base_reference

        self.peft_base: dict[str, object] = random_base_reference(
            seed=cfg.optim.seed, model_name=cfg.model.name, pp=cfg.parallel.pp, ep=cfg.parallel.ep,
            moe=cfg.model.is_moe)
        """The frozen base an adapter checkpoint references (`lora_ckpt.base_reference`): a random base's seed, model
        and the pp / ep it is drawn under (`lora_ckpt.random_base_reference`) until `build.init_trainer_from_hf`
        sets the HF checkpoint's path and fingerprint."""
        self.chunks = [wrap.wrap_model(model, self.tcfg, cfg)]
        step.configure_schedule(self.tcfg, self.chunks)
        self.optimizer = wrap.build_optimizer(self.chunks, cfg)
        self._optim: OptimConfig | None = None
        """Settings given to `reset_optimizer` for the steps since (the warm start's), else None: `cfg.optim`."""
        self.step = 0
        self.routing_replay = cfg.routing_replay
        """MoE routing replay mode of the next steps (none | ids | ids_and_weights); may be changed
        between steps (the model always carries Megatron's RouterReplay)."""

    def _rl_data(self, batch: TrainBatch) -> tuple[dict[str, Tensor], MicroBatchPlan]:
        """A TrainBatch as the step's row-wise tensors (`policy_loss.batch_tensors`: the loss functions'
        names) and the micro-batch plan to execute: the batch's own (`batch.pack_micro_batches`, logged
        by the loop), or, for a batch without one, planned by the same function from
        `micro_batch_tokens` (or `micro_batch_size` rows at a time). Each DP rank executes its share
        (`microbatch.rank_share`)."""
        data: dict[str, Any] = batch_tensors(batch)
        micro = batch.micro_batches
        packed = batch.packed if micro else self.pack_sequences
        if self.cfg.logit_temperature != 1.0:  # RL: the sampling distribution's log-probs
            if self.head_loss_fn is not None:
                raise ValueError(f"rollout.temperature={self.cfg.logit_temperature!r}: the fused CISPO head "
                                 "computes T=1 log-probs; use train.fused_cispo=false")
            data["logit_temperature"] = float(self.cfg.logit_temperature)
        return data, self._plan(data, micro=micro, lengths=batch.lengths_B, packed=packed)

    def _sft_data(self, batch: SftBatch) -> tuple[dict[str, Tensor], MicroBatchPlan]:
        """An SftBatch as the step's row-wise tensors and its plan: rows of the batch width, never
        packed (no `advantages`: the loss functions take the next-token cross-entropy)."""
        data = {"input_ids": batch.input_ids_BT, "position_ids": batch.position_ids_BT,
                "targets": batch.targets_BT, "loss_mask": batch.loss_mask_BT}
        return data, self._plan(data, micro=None, lengths=None, packed=False)

    def _plan(self, data: dict[str, Tensor], *, micro: list[list[int]] | None, lengths: list[int] | None,
              packed: bool) -> MicroBatchPlan:
        from scalerl_mega.trainer.microbatch import plan_of

        rows, seq_len = (int(n) for n in data["input_ids"].shape[:2])
        plan = plan_of(rows=rows, seq_len=seq_len, micro_batches=micro, lengths=lengths, packed=packed,
                       micro_batch_tokens=self.micro_batch_tokens, micro_batch_size=self.cfg.parallel.micro_batch_size)
        if plan.packed and self.cfg.parallel.cp > 1:
            raise ValueError(f"train.pack_sequences with parallel.cp={self.cfg.parallel.cp}: packed rows are not "
                             "split for context parallelism; use cp=1 or pack_sequences=false")
        return plan

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One RL optimizer step on the global batch (identical on every rank; each trains its DP share
        of the micro-batch plan). Returns the global metrics, the same on every rank: shares summed over
        micro-batches and DP ranks, turned into the logged diagnostics by
        `policy_loss.finalize_train_metrics`, plus the executed `padding_fraction`."""
        return self._optimizer_step(*self._rl_data(batch))

    def sft_step(self, batch: SftBatch) -> dict[str, float]:
        """One supervised optimizer step (the warm start, sft.py): masked next-token cross-entropy on
        the batch's target tokens; metrics as `train_step`'s."""
        return self._optimizer_step(*self._sft_data(batch))

    def _optimizer_step(self, data: dict[str, Tensor], plan: MicroBatchPlan) -> dict[str, float]:
        from scalerl_mega.trainer.megatron import step

        metrics = step.train_step(self.chunks, self.optimizer, data, step=self.step, optim=self.optim,
                                  parallel=self.cfg.parallel, loss_fn=self.loss_fn,
                                  head_loss_fn=self.head_loss_fn, plan=plan, routes=self._routes(plan))
        metrics = finalize_train_metrics(metrics)
        self.step += 1
        metrics["step"] = float(self.step)
        return metrics

    def _routes(self, plan: MicroBatchPlan) -> RouteTracker | None:
        """A fresh `routing.RouteTracker` for one step (MoE models), else None. Packed micro-batches
        (`train.pack_sequences`) carry no per-row routes: refused with routing replay on, untracked off."""
        if not self.cfg.model.is_moe:
            return None
        if plan.packed:
            if self.routing_replay != "none":
                raise ValueError(f"moe.routing_replay={self.routing_replay!r} with train.pack_sequences=true: "
                                 "routes are not packed; use train.pack_sequences=false")
            return None
        from scalerl_mega.trainer.megatron.routing import RouteTracker

        return RouteTracker(self.chunks, self.cfg.model, mode=self.routing_replay)

    def logprobs(self, batch: TrainBatch | SftBatch, *, with_metrics: bool = False
                 ) -> Tensor | None | tuple[Tensor | None, dict[str, float]]:
        """FP32 log-probs of the batch targets [B, T] (the rows this DP rank executed, all at dp=1; last
        pipeline stage, None elsewhere). `with_metrics`: (logp, routing agreement metrics) -- the
        forward replays routes per `routing_replay` like a training step."""
        from scalerl_mega.trainer.megatron import step

        data, plan = self._sft_data(batch) if isinstance(batch, SftBatch) else self._rl_data(batch)
        for chunk in self.chunks:
            chunk.eval()
        try:
            routes = self._routes(plan)
            out = step.compute_logprobs(self.chunks, data, parallel=self.cfg.parallel, plan=plan, routes=routes)
            logp, metrics = out if routes is not None else (out, {})
            return (logp, metrics) if with_metrics else logp
        finally:
            for chunk in self.chunks:
                chunk.train()

    def export_hf_weights(self, *, dtype: str | None = None) -> Iterator[tuple[str, Any]]:
        """HF-named full tensors of the whole model, on the training device, cast to `dtype` (a torch
        dtype name such as "bfloat16": the generator's; `export.weight_dtypes` for "+fp32_head"),
        yielded on global rank 0; every rank must
        exhaust the iterator (TP/EP gathers inside each pipeline stage, later stages relayed to rank 0;
        `export.export_to_rank0`). The stream announces its names/shapes/dtypes up front
        (`weight_sync.PlannedTensors`), so an engine checks them before the first bucket is sent. With `peft=lora`
        these are the frozen base's weights: the adapters are not in them (`export_adapter`)."""
        from scalerl_mega.weight_sync import PlannedTensors
        from scalerl_mega.trainer.megatron import export

        return PlannedTensors(export.export_to_rank0(self.chunks, self.cfg.model, dtype=dtype),
                              plan=export.export_plan(self.cfg.model, dtype=dtype))

    def export_adapter(self, *, dtype: str | None = None, base_model: str = "") -> tuple[dict[str, object], list[tuple[str, Tensor]]]:
        """`peft=lora`: (PEFT `adapter_config.json` content, [(PEFT tensor name, full tensor), ...]) on global rank 0,
        an empty list on the others; every rank must call it (`lora_export.export_peft_adapter`). `dtype`: a torch
        dtype name for the tensors (None: the parameters')."""
        from scalerl_mega.trainer.megatron.export import _as_dtype
        from scalerl_mega.trainer.megatron.lora_export import export_peft_adapter

        if self.peft is None:
            raise ValueError("export_adapter needs peft.kind=lora (this trainer trains the full model)")
        return export_peft_adapter(self.chunks, self.cfg.model, self.peft, dtype=_as_dtype(dtype), base_model=base_model)

    def peft_bytes(self, *, dtype: str | None = None) -> int:
        """Bytes of the tensors `export_adapter(dtype=dtype)` returns (the adapters' full, unsharded tensors; fused
        linears' A counted once per HF projection, as PEFT stores it); 0 without `peft=lora`."""
        from scalerl_mega.config.peft import target_kinds
        from scalerl_mega.model.lora_shapes import peft_export_numel

        if self.peft is None:
            return 0
        kinds = target_kinds(list(self.peft.targets))
        return peft_export_numel(self.cfg.model, rank=int(self.peft.rank), kinds=kinds) * self._itemsize(dtype)

    def model_bytes(self, *, dtype: str | None = None) -> int:
        """Bytes of the whole model's HF tensors (what a full weight push sends) at `dtype` (None: the parameters')."""
        from scalerl_mega.convert import tables
        from scalerl_mega.convert.model_config import dims_from_model_config

        dims = dims_from_model_config(self.cfg.model)
        numel = sum(_prod(tables.expected_hf_shape(n, dims)) for n in tables.hf_names(dims))
        return numel * self._itemsize(dtype)

    def _itemsize(self, dtype: str | None) -> int:
        import torch

        from scalerl_mega.trainer.megatron.export import _as_dtype

        return torch.empty((), dtype=_as_dtype(dtype or self.cfg.params_dtype)).element_size()

    @property
    def optim(self) -> OptimConfig:
        """The optimizer settings of the steps being taken: `cfg.optim` (RL), or those given to `reset_optimizer`
        (the SFT warm start's lr and warmup) until the next reset."""
        return self._optim if self._optim is not None else self.cfg.optim

    def reset_optimizer(self, optim: OptimConfig | None = None) -> None:
        """Fresh optimizer state and step counter (e.g. after an SFT warm start, before RL), with the settings
        `optim` (default: the run's `cfg.optim`; `cfg` itself is never changed)."""
        import dataclasses

        from scalerl_mega.trainer.megatron import wrap

        self._optim = optim
        cfg = self.cfg if optim is None else dataclasses.replace(self.cfg, optim=optim)
        self.optimizer = wrap.build_optimizer(self.chunks, cfg)
        self.step = 0

    def save(self, path: str, *, step: Optional[int] = None, extra_state: Optional[dict[str, Any]] = None) -> None:
        """The checkpoint is named `step` (the loop's; default the optimizer-step count); the optimizer-step
        count itself is saved in the extra state (the LR schedule resumes from it)."""
        import torch

        from scalerl_mega.trainer.megatron import checkpoint

        state = {"step": self.step, "torch_rng_state": torch.get_rng_state(), **(extra_state or {})}
        if self.peft is not None:  # an adapter-only checkpoint: the base is referenced (lora_ckpt.py)
            import dataclasses

            state["peft"] = {"config": dataclasses.asdict(self.peft) if dataclasses.is_dataclass(self.peft)
                             else dict(self.peft), "base": dict(self.peft_base)}
        checkpoint.save_checkpoint(path, step=self.step if step is None else int(step), chunks=self.chunks,
                                   optimizer=self.optimizer, extra_state=state, model_config=self.cfg.model,
                                   optimizer_format=self.cfg.optim.checkpoint_format)

    def load(self, path: str) -> dict[str, Any]:
        import torch

        from scalerl_mega.trainer.megatron import checkpoint

        state = checkpoint.load_checkpoint(path, chunks=self.chunks, optimizer=self.optimizer)
        saved_peft = state.pop("peft", None)
        if self.peft is not None:
            from scalerl_mega.trainer.megatron.lora_ckpt import check_base

            check_base((saved_peft or {}).get("base"), self.peft_base, where=f"checkpoint {path}")
        self.step = int(state.pop("step", 0))
        rng = state.pop("torch_rng_state", None)
        if rng is not None:
            torch.set_rng_state(rng)
        return state

    def close(self) -> None:
        from scalerl_mega.trainer.megatron import parallel

        parallel.teardown_parallel()


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out
