"""`MegatronPolicyTrainer`: the PolicyTrainer seam (interfaces.py) on Megatron-Core, CPU and GPU."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from scalerl_mega.trainer.megatron.config import MegatronConfig
from scalerl_mega.trainer.megatron.step import HeadLossFn, LossFn, next_token_ce_loss
from scalerl_mega.trainer.policy_loss import batch_tensors, finalize_train_metrics, pad_batch


class MegatronPolicyTrainer:
    """Builds process groups, model, DDP and optimizer from a validated `MegatronConfig`.

    `loss_fn(logp_BT, mb) -> (loss, metrics)` (see step.py for the normalisation contract);
    the default is next-token cross-entropy. `head_loss_fn(LMHead, mb) -> (loss, metrics)`, if given,
    replaces it in training steps: the output layer is skipped and the loss computes the FP32 head
    itself without [N, V] logits (e.g. fused CISPO); `logprobs` keeps the logits path.
    `micro_batch_tokens`: split each step's rows into micro-batches by this token budget instead of
    `cfg.parallel.micro_batch_size` rows (RL batches have a variable number of rows).
    Construct inside `if __name__ == "__main__":` (checkpoint saves spawn a multiprocessing Manager).
    """

    def __init__(self, cfg: MegatronConfig, *, loss_fn: LossFn = next_token_ce_loss,
                 head_loss_fn: HeadLossFn | None = None, micro_batch_tokens: int | None = None) -> None:
        from scalerl_mega.trainer.megatron import models, parallel, step, wrap

        cfg.validate(world_size=parallel.world_size_from_env())  # before any process group starts
        self.cfg = cfg
        if micro_batch_tokens is not None and micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens={micro_batch_tokens} must be >= 1")
        self.loss_fn = loss_fn
        self.head_loss_fn = head_loss_fn
        self.micro_batch_tokens = micro_batch_tokens
        self.info = parallel.init_parallel(cfg.parallel, model=cfg.model, seed=cfg.optim.seed)
        model, self.tcfg = models.build_model(cfg.model, cfg.parallel, params_dtype=cfg.params_dtype,
                                              recompute=cfg.recompute)
        self.chunks = [wrap.wrap_model(model, self.tcfg, cfg)]
        step.configure_schedule(self.tcfg, self.chunks)
        self.optimizer = wrap.build_optimizer(self.chunks, cfg)
        self.step = 0

    def _data(self, batch) -> dict:
        """A TrainBatch (or an SFT batch dict) as the step's dict, padded with rows that train nothing
        so every data-parallel rank takes an equal contiguous share (the deterministic DP split), and,
        under sequence parallelism, with positions that train nothing up to a multiple of the TP size."""
        from megatron.core import parallel_state as ps

        data = batch if isinstance(batch, dict) else batch_tensors(batch)
        per_rank = 1 if self.micro_batch_tokens is not None else self.cfg.parallel.micro_batch_size
        tp = ps.get_tensor_model_parallel_world_size()
        return pad_batch(data, rows_multiple=ps.get_data_parallel_world_size() * per_rank,
                         cols_multiple=tp if self.cfg.parallel.sequence_parallel and tp > 1 else 1)

    def train_step(self, batch) -> dict[str, float]:
        """One optimizer step on the global batch (identical on every rank; each trains its DP rows).
        Returns the global metrics, the same on every rank: shares summed over micro-batches and DP
        ranks, turned into the logged diagnostics by `policy_loss.finalize_train_metrics`."""
        from scalerl_mega.trainer.megatron import step

        data = self._data(batch)
        metrics = step.train_step(self.chunks, self.optimizer, data, step=self.step, optim=self.cfg.optim,
                                  parallel=self.cfg.parallel, loss_fn=self.loss_fn,
                                  head_loss_fn=self.head_loss_fn, micro_batch_tokens=self.micro_batch_tokens)
        metrics = finalize_train_metrics(metrics)
        self.step += 1
        metrics["step"] = float(self.step)
        return metrics

    def logprobs(self, batch):
        """FP32 log-probs of the batch targets (this DP rank's rows, including padding rows, of the
        batch's T positions; last pipeline stage, None elsewhere)."""
        from scalerl_mega.trainer.megatron import step

        data = self._data(batch)
        seq_len = int((batch if isinstance(batch, dict) else batch_tensors(batch))["input_ids"].shape[1])
        for chunk in self.chunks:
            chunk.eval()
        try:
            logp = step.compute_logprobs(self.chunks, data, parallel=self.cfg.parallel,
                                         micro_batch_tokens=self.micro_batch_tokens)
            return None if logp is None else logp[:, :seq_len]
        finally:
            for chunk in self.chunks:
                chunk.train()

    def export_hf_weights(self, *, dtype: str | None = None) -> Iterator[tuple[str, Any]]:
        """HF-named full tensors of the whole model, on the training device, cast to `dtype` (a torch
        dtype name such as "bfloat16": the generator's), yielded on global rank 0; every rank must
        exhaust the iterator (TP/EP gathers inside each pipeline stage, later stages relayed to rank 0;
        `export.export_to_rank0`). The stream announces its names/shapes/dtypes up front
        (`weight_sync.PlannedTensors`), so an engine checks them before the first bucket is sent."""
        from scalerl_mega.rollout.weight_sync import PlannedTensors
        from scalerl_mega.trainer.megatron import export

        return PlannedTensors(export.export_to_rank0(self.chunks, self.cfg.model, dtype=dtype),
                              plan=export.export_plan(self.cfg.model, dtype=dtype))

    def reset_optimizer(self) -> None:
        """Fresh optimizer state and step counter (e.g. after an SFT warm start, before RL)."""
        from scalerl_mega.trainer.megatron import wrap

        self.optimizer = wrap.build_optimizer(self.chunks, self.cfg)
        self.step = 0

    def save(self, path: str, *, extra_state: Optional[dict[str, Any]] = None) -> None:
        import torch

        from scalerl_mega.trainer.megatron import checkpoint

        state = {"step": self.step, "torch_rng_state": torch.get_rng_state(), **(extra_state or {})}
        checkpoint.save_checkpoint(path, step=self.step, chunks=self.chunks, optimizer=self.optimizer,
                                   extra_state=state, model_config=self.cfg.model,
                                   optimizer_format=self.cfg.optim.checkpoint_format)

    def load(self, path: str) -> dict[str, Any]:
        import torch

        from scalerl_mega.trainer.megatron import checkpoint

        state = checkpoint.load_checkpoint(path, chunks=self.chunks, optimizer=self.optimizer)
        self.step = int(state.pop("step", 0))
        rng = state.pop("torch_rng_state", None)
        if rng is not None:
            torch.set_rng_state(rng)
        return state

    def close(self) -> None:
        from scalerl_mega.trainer.megatron import parallel

        parallel.teardown_parallel()
