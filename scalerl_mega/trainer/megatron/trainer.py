"""`MegatronPolicyTrainer`: the PolicyTrainer seam (DESIGN.md) on Megatron-Core, CPU and GPU."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from scalerl_mega.trainer.megatron.config import MegatronConfig
from scalerl_mega.trainer.megatron.step import HeadLossFn, LossFn, next_token_ce_loss


def batch_to_dict(batch) -> dict:
    """TrainBatch -> the dict of tensors the step consumes (targets/loss_mask/... keep their names)."""
    out = {"input_ids": batch.input_ids_BT, "position_ids": batch.position_ids_BT,
           "targets": batch.targets_BT, "loss_mask": batch.loss_mask_BT, "gen_logp": batch.gen_logp_BT,
           "advantages": batch.advantages_B, "prompt_index": batch.prompt_index_B}
    if batch.weight_version_BT is not None:
        out["weight_version"] = batch.weight_version_BT
    return out


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

    def train_step(self, batch) -> dict[str, float]:
        from scalerl_mega.trainer.megatron import step

        data = batch if isinstance(batch, dict) else batch_to_dict(batch)
        metrics = step.train_step(self.chunks, self.optimizer, data, step=self.step, optim=self.cfg.optim,
                                  parallel=self.cfg.parallel, loss_fn=self.loss_fn,
                                  head_loss_fn=self.head_loss_fn, micro_batch_tokens=self.micro_batch_tokens)
        self.step += 1
        metrics["step"] = float(self.step)
        return metrics

    def logprobs(self, batch):
        """FP32 log-probs of the batch targets (this DP rank's rows, last pipeline stage)."""
        from scalerl_mega.trainer.megatron import step

        data = batch if isinstance(batch, dict) else batch_to_dict(batch)
        for chunk in self.chunks:
            chunk.eval()
        try:
            return step.compute_logprobs(self.chunks, data, parallel=self.cfg.parallel,
                                         micro_batch_tokens=self.micro_batch_tokens)
        finally:
            for chunk in self.chunks:
                chunk.train()

    def export_hf_weights(self) -> Iterator[tuple[str, Any]]:
        from scalerl_mega.trainer.megatron import export  # written separately; imported lazily

        return export.export_hf_weights(self.chunks, self.cfg.model)

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
                                   extra_state=state, model_config=self.cfg.model)

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
