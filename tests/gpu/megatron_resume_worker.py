"""GPU worker for test_megatron_gpu.py (not a test module): save -> load -> next step, on one GPU.

A bf16 MegatronPolicyTrainer (FP32 head and FP32 main weights: the distributed optimizer at dp 1)
takes STEPS steps, saves, and takes two more (the reference). A fresh trainer loads the checkpoint
and takes the same two steps; a control trainer loads only the model (fresh Adam state). Megatron's
inner optimizer is whatever it selects on this machine: TransformerEngine's FusedAdam when TE is
installed (the optimizer a resume used to crash with KeyError 'step', checkpoint._prime_fresh_optimizer).
Writes --out/resume.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STEPS = 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)

    import torch

    from scalerl_mega.trainer.megatron import checkpoint, models
    from scalerl_mega.trainer.megatron.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import TrainBatch

    models.te_available = lambda: False  # local layer spec (the optimizer is still Megatron's choice)
    cfg = MegatronConfig(model=load_model_preset("tiny_dense"), parallel=ParallelConfig(micro_batch_size=2),
                         optim=OptimConfig(lr=5e-3, adam_eps=1e-4), params_dtype="bfloat16")
    g = torch.Generator().manual_seed(5)
    B, T = 4, 64
    ids = torch.randint(0, cfg.model.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, -1] = 0.0
    batch = TrainBatch(input_ids_BT=ids, position_ids_BT=torch.arange(T).expand(B, T).contiguous(),
                       loss_mask_BT=mask, targets_BT=torch.roll(ids, -1, 1) * (mask > 0).long(),
                       gen_logp_BT=torch.zeros(B, T), advantages_B=torch.zeros(B), prompt_index_B=torch.arange(B),
                       token_weights_BT=mask / mask.sum())
    ckpt = str(out / "ckpt")
    res: dict = {}

    a = MegatronPolicyTrainer(cfg)
    subs = getattr(a.optimizer, "chained_optimizers", None) or [a.optimizer]
    res["inner_optimizers"] = sorted({f"{type(s.optimizer).__module__}.{type(s.optimizer).__name__}" for s in subs})
    try:
        import transformer_engine  # noqa: F401

        res["te_installed"] = True
    except ImportError:
        res["te_installed"] = False
    for _ in range(STEPS):
        a.train_step(batch)
    a.save(ckpt)
    res["ref"] = [a.train_step(batch)["loss"] for _ in range(2)]
    a.close()

    b = MegatronPolicyTrainer(cfg)
    b.load(ckpt)
    res["resumed"] = [b.train_step(batch)["loss"] for _ in range(2)]
    b.close()

    c = MegatronPolicyTrainer(cfg)
    checkpoint.load_checkpoint(ckpt, chunks=c.chunks)  # model only: fresh Adam moments and step
    c.step = STEPS
    res["fresh_optimizer"] = [c.train_step(batch)["loss"] for _ in range(2)]
    c.close()
    (out / "resume.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
