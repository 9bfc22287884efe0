"""Worker of tests/integration/test_lora_ep_reshard.py: a LoRA checkpoint of tiny_qwen3_moe (adapters on every
linear, routed experts included) resumed under another expert-parallel size. Launched by mp_launch as 1 or 2 ranks.

    --phase one      one rank: write the base's global tensors, step 1, save, step 2 (the uninterrupted run)
    --phase ep2      EP 2 over 2 ranks, the same base: step 1, save, step 2; then load `one`'s checkpoint, step 2
    --phase resume   one rank, the same base: load `ep2`'s checkpoint, step 2 (first into a trainer with one
                     rank's default optimizer, torch Adam: refused, recorded)

Each phase records, on rank 0, the adapters (`trainer.export_adapter`: full tensors under PEFT names) after step 1
and right after each load, and the loss, grad norm, adapters and probe log-probs of each step 2 (DIR/<phase>.pt).
The base is one tensor set for every phase (`lora_worker._load_base`: a random expert is drawn per expert-parallel
rank, so a seed alone gives EP 2 other experts) and each trainer references it as `init_from_hf` would
(`lora_ckpt.base_reference` of DIR/base), so the checkpoints' base check passes only because the base is the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lora_worker import _batch, _cfg, _env_single, _global_base, _load_base  # noqa: E402  (sys.path first)

MODEL = "tiny_qwen3_moe"


def _trainer(ep: int, *, distributed_optimizer: bool = True):
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    cfg = _cfg(MODEL, tp=1, ep=ep, sp=False, lora=True)
    if not distributed_optimizer:  # the default at one rank (DP 1): torch Adam
        return MegatronPolicyTrainer(cfg)
    # the distributed optimizer at every layout (EP 2 is DP 2 for the dense adapters: on by default there), its
    # state written in model space, so it reshards (trainer/megatron/checkpoint.py, optimizer formats)
    optim = dataclasses.replace(cfg.optim, use_distributed_optimizer=True, checkpoint_format="fully_reshardable")
    cfg = dataclasses.replace(cfg, optim=optim)
    return MegatronPolicyTrainer(cfg)


def _adapters(trainer) -> dict:
    return {k: v.clone() for k, v in trainer.export_adapter()[1]}


def _step2(trainer, vocab: int) -> dict:
    m = trainer.sft_step(_batch(300, vocab))
    return {"loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]), "adapters": _adapters(trainer),
            "logp": trainer.logprobs(_batch(9, vocab)).clone()}


def main() -> None:
    import torch
    import torch.distributed as dist

    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.trainer.megatron.lora_ckpt import base_reference

    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--phase", choices=("one", "ep2", "resume"), required=True)
    args = ap.parse_args()
    out = Path(args.dir)
    vocab = load_model_preset(MODEL).vocab_size
    res: dict = {"mask": _batch(9, vocab).loss_mask_BT}
    if args.phase == "resume":  # the distributed optimizer's state into one rank's default optimizer: refused
        plain = _trainer(1, distributed_optimizer=False)
        try:
            plain.load(str(out / "ckpt_ep2"))
        except ValueError as exc:
            res["plain_adam_refused"] = str(exc)
        plain.close()
        _env_single()  # a fresh rendezvous for the next trainer of this process
    trainer = _trainer(2 if args.phase == "ep2" else 1)
    res["random_base_reference"] = dict(trainer.peft_base)
    if args.phase == "one":
        (out / "base").mkdir()
        torch.save(_global_base(trainer), out / "base" / "base.pt")
    else:  # first: how many of this rank's randomly drawn base tensors differ from the one-rank draw
        base = torch.load(out / "base" / "base.pt")
        res["own_draw_differs"] = sorted(n for n, t in _global_base(trainer).items() if not torch.equal(t, base[n]))
        _load_base(trainer, str(out / "base" / "base.pt"))
    trainer.peft_base = base_reference(str(out / "base"), seed=7, model_name=MODEL)
    if args.phase in ("one", "ep2"):
        trainer.sft_step(_batch(100, vocab))
        res["after_step1"] = _adapters(trainer)
        trainer.save(str(out / f"ckpt_{args.phase}"))
        res["continued"] = _step2(trainer, vocab)
    source = {"ep2": "one", "resume": "ep2"}.get(args.phase)
    if source is not None:
        trainer.load(str(out / f"ckpt_{source}"))
        res["after_load"] = _adapters(trainer)
        res["resumed"] = _step2(trainer, vocab)
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(res, out / f"{args.phase}.pt")
    trainer.close()


if __name__ == "__main__":
    main()
