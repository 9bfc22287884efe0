"""Worker for test_convert_distckpt (2 gloo processes; not a test module).

For each case: build ``MegatronPolicyTrainer`` in the case's layout, train one step, save a
training checkpoint (Megatron dist-checkpointing under ``<out>/<case>/ckpt``), then write the
trained model's full logits on a fixed input (gathered over TP; at PP>1 the target log-probs,
``logprobs.pt``) and the trainer's ``ModelConfig``
to ``<out>/<case>/trainer.pt`` (rank 0). The process group is reused between cases.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

B, T = 2, 16
LLAMA4_FEATURES = dict(rope_theta=500000.0, rope_scaling=True, rope_scaling_factor=16.0, no_rope_freq=2,
                       attention_chunk_size=4, attn_temperature_tuning=True, floor_scale=2.0, attn_scale=0.5,
                       qk_l2_norm=True, init_method_std=0.1)
CASES = {
    # Llama-4 MoE (4 experts top-1 + shared expert) with every Llama-4 attention feature, EP2 (dp2)
    "moe_ep2": ("tiny_moe", dict(num_layers=4, **LLAMA4_FEATURES), dict(ep=2)),
    # Llama-3 dense, tied embeddings, TP2
    "dense_tp2": ("tiny_dense", dict(tie_embeddings=True, init_method_std=0.1), dict(tp=2)),
    # the MoE at PP2: target log-probs instead of logits (a plain forward does not run the pipeline)
    "moe_pp2": ("tiny_moe", dict(num_layers=4, **LLAMA4_FEATURES), dict(pp=2)),
}


def batch(vocab: int, seed: int):
    import torch

    from scalerl_mega.types import SftBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, -1] = 0.0
    return SftBatch(input_ids_BT=ids, position_ids_BT=torch.arange(T).expand(B, T).contiguous(),
                    targets_BT=torch.roll(ids, -1, dims=1), loss_mask_BT=mask)


def run_case(name: str, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import tensor_parallel

    from scalerl_mega.trainer.megatron import parallel
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    preset, overrides, layout = CASES[name]
    cfg = MegatronConfig(model=load_model_preset(preset, overrides=overrides), parallel=ParallelConfig(**layout),
                         optim=OptimConfig(lr=1e-2, warmup_steps=0, adam_eps=1e-4))
    trainer = MegatronPolicyTrainer(cfg)
    metrics = trainer.sft_step(batch(cfg.model.vocab_size, seed=1))
    trainer.save(str(out / name / "ckpt"))
    probe = batch(cfg.model.vocab_size, seed=2)
    logits = None
    if cfg.parallel.pp == 1:
        model = trainer.chunks[0].module
        model.eval()
        with torch.no_grad():
            logits = tensor_parallel.gather_from_tensor_model_parallel_region(
                model(probe.input_ids_BT, probe.position_ids_BT, None)).float()
    else:
        logp_BT = trainer.logprobs(probe)  # collective; the last stage (dp=1 here) holds all rows
        if trainer.info.is_last_stage and trainer.info.tp_rank == 0:
            torch.save({"input_ids": probe.input_ids_BT, "targets": probe.targets_BT, "logp": logp_BT.float()},
                       out / name / "logprobs.pt")
    if dist.get_rank() == 0:
        torch.save({"input_ids": probe.input_ids_BT, "logits": logits, "loss": metrics["loss"],
                    "model": dataclasses.asdict(cfg.model)}, out / name / "trainer.pt")
    parallel.teardown_parallel(destroy_process_group=False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args()
    for name in args.cases.split(","):
        run_case(name, Path(args.out))
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
