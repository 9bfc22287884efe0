"""torchrun worker: MegatronPolicyTrainer end to end on a TrainBatch (TP2 + SP on 2 processes).

Checks written to --out/trainer.json: forward-only log-probs agree with the training loss, and
save -> step -> load -> step repeats the step exactly (PolicyTrainer save/load).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)

    import torch
    import torch.distributed as dist

    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import TrainBatch

    cfg = MegatronConfig(model=load_model_preset("tiny_dense"),
                         parallel=ParallelConfig(tp=2, sequence_parallel=True, micro_batch_size=2),
                         optim=OptimConfig(lr=5e-3, warmup_steps=1, adam_eps=1e-4))
    trainer = MegatronPolicyTrainer(cfg)
    g = torch.Generator().manual_seed(3)
    B, T = 4, 24
    ids = torch.randint(0, 256, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, :8] = 0.0
    mask[:, -1] = 0.0
    batch = TrainBatch(input_ids_BT=ids, position_ids_BT=torch.arange(T).expand(B, T).contiguous(),
                       loss_mask_BT=mask, targets_BT=torch.roll(ids, -1, 1) * (mask > 0).long(),
                       gen_logp_BT=torch.zeros(B, T), advantages_B=torch.zeros(B),
                       prompt_index_B=torch.arange(B), token_weights_BT=mask / mask.sum())
    res = {}
    trainer.train_step(batch)
    logp = trainer.logprobs(batch)  # [B, T] at dp=1
    res["ce_from_logprobs"] = float(-(logp.double() * mask.double()).sum() / mask.sum())
    m2 = trainer.train_step(batch)
    res["loss_step2"] = m2["loss"]
    ck = out / "trainer_ckpt"
    trainer.save(str(ck), extra_state={"sampler": {"cursor": 17}})
    m3 = trainer.train_step(batch)
    extra = trainer.load(str(ck))
    m3b = trainer.train_step(batch)
    res.update(step3=[m3["loss"], m3["grad_norm"]], step3_again=[m3b["loss"], m3b["grad_norm"]],
               extra=extra, step_after=trainer.step)
    if dist.get_rank() == 0:
        (out / "trainer.json").write_text(json.dumps(res))
    trainer.close()


if __name__ == "__main__":
    main()
