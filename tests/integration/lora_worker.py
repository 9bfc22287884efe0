"""Worker of tests/integration/test_lora.py: LoRA (`peft=lora`) on the Megatron trainer, one process or torchrun.

    python lora_worker.py --worker OUT.json --model tiny_qwen3 [--hf-check]     (one rank, outside torchrun)
    torchrun --nproc_per_node=2 lora_worker.py --worker OUT.json --model tiny_qwen3 --tp 2 --sp

Every run: the same seeded batches, two SFT steps at a high learning rate, then the trained adapters exported to
PEFT (`trainer.export_adapter`) and the log-probs of a batch, saved to OUT.pt (rank 0) for the test to compare
across layouts. One rank also checks step 0 against a `peft=none` trainer of the same seed, the frozen base,
the optimizer and grad-buffer sizes and, with --hf-check, HF + PEFT; every run a save / step / load / step round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RANK = 4
ALPHA = 8.0


def _env_single() -> None:
    from scalerl_mega.trainer.megatron.parallel import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")


def _cfg(model: str, *, tp: int, ep: int, sp: bool, lora: bool):
    from scalerl_mega.config.peft import PeftConfig
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset

    peft = PeftConfig(kind="lora", rank=RANK, alpha=ALPHA) if lora else None
    return MegatronConfig(model=load_model_preset(model), peft=peft,
                          parallel=ParallelConfig(tp=tp, ep=ep, sequence_parallel=sp or None, micro_batch_size=2),
                          optim=OptimConfig(lr=3e-2, warmup_steps=0, adam_eps=1e-8, clip_grad=0.0, seed=7))


def _batch(seed: int, vocab: int):
    import torch

    from scalerl_mega.types import SftBatch

    g = torch.Generator().manual_seed(seed)
    B, T = 4, 16
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, :3] = 0.0
    mask[:, -1] = 0.0
    return SftBatch(input_ids_BT=ids, position_ids_BT=torch.arange(T).expand(B, T).contiguous(),
                    targets_BT=torch.roll(ids, -1, 1) * (mask > 0).long(), loss_mask_BT=mask)


def _base_logprobs(model: str, batch):
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    base = MegatronPolicyTrainer(_cfg(model, tp=1, ep=1, sp=False, lora=False))
    logp = base.logprobs(batch).clone()
    weights = {n: p.detach().clone() for n, p in base.chunks[0].module.named_parameters()}
    base.close()
    _env_single()
    return logp, weights


def _global_base(trainer) -> dict:
    """The base model's full tensors under their global names (one rank: its parameters are the full tensors)."""
    from scalerl_mega.convert.model_config import dims_from_model_config
    from scalerl_mega.trainer.megatron.global_names import global_params

    gpt = trainer.chunks[0].module
    return {n: p.detach().clone() for n, p in global_params(gpt, dims_from_model_config(trainer.cfg.model)).items()}


def _load_base(trainer, path: str) -> None:
    """Another layout's base = the one-rank run's (expert weights are drawn per expert-parallel rank, so a seed alone
    does not give the same experts under EP2)."""
    import torch

    from scalerl_mega.convert.load import load_full_tensors
    from scalerl_mega.convert.model_config import dims_from_model_config

    base = torch.load(path)
    load_full_tensors(trainer.chunks, dims=dims_from_model_config(trainer.cfg.model), full_tensor=base.__getitem__)
    trainer.optimizer.reload_model_params()


def _frozen_checks(trainer, base_weights) -> dict:
    """Base parameters frozen and equal to the peft=none model's; grad buffers and optimizer state only for the
    adapters."""
    gpt = trainer.chunks[0].module
    trainable = [(n, p) for n, p in gpt.named_parameters() if p.requires_grad]
    ddp = trainer.chunks[0]
    ddp_numel = sum(p.numel() for b in ddp.buffers + ddp.expert_parallel_buffers for p in b.params)
    opt_params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    return {"trainable": sum(p.numel() for _, p in trainable),
            "trainable_names_all_lora": all(".lora.lora_" in n for n, _ in trainable),
            "ddp_buffer_numel": ddp_numel, "optimizer_param_numel": sum(p.numel() for p in opt_params),
            "base_equal_to_peft_none": all(torch_equal(p, base_weights[n]) for n, p in gpt.named_parameters()
                                           if not p.requires_grad)}


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a.detach(), b))


def _train(trainer, vocab: int) -> None:
    for s in range(2):
        trainer.sft_step(_batch(100 + s, vocab))


def _after_training(trainer, base_weights) -> dict:
    import torch

    gpt = trainer.chunks[0].module
    frozen_same = all(torch.equal(p.detach(), base_weights[n]) for n, p in gpt.named_parameters() if not p.requires_grad)
    b_moved = all(bool(p.detach().abs().max() > 0) for n, p in gpt.named_parameters() if n.endswith("lora_B"))
    return {"frozen_unchanged_after_steps": frozen_same, "every_B_nonzero": b_moved}


def _roundtrip(trainer, vocab: int, out: Path) -> dict:
    """save -> step -> load -> step: the second step repeats the first exactly (adapters + Adam state)."""
    ck = out.parent / f"lora_ckpt_{os.environ['WORLD_SIZE']}rank"
    trainer.save(str(ck))
    m1 = trainer.sft_step(_batch(300, vocab))
    logp1 = trainer.logprobs(_batch(9, vocab))
    trainer.load(str(ck))
    m2 = trainer.sft_step(_batch(300, vocab))
    logp2 = trainer.logprobs(_batch(9, vocab))
    files = sorted(p.name for p in next(ck.glob("step_*")).iterdir())
    ckpt_bytes = sum(p.stat().st_size for p in next(ck.glob("step_*")).rglob("*") if p.is_file())
    return {"resume_loss": [m1["loss"], m2["loss"]], "resume_logp_equal": torch_equal(logp1, logp2),
            "resume_logp_max_abs": float((logp1 - logp2).abs().max()), "resume_grad_norm": [m1["grad_norm"], m2["grad_norm"]],
            "ckpt_files": files, "ckpt_bytes": ckpt_bytes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--model", default="tiny_qwen3")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--sp", action="store_true")
    ap.add_argument("--hf-check", action="store_true")
    ap.add_argument("--resume-from", help="after training, load this adapter checkpoint (another layout's) and "
                    "record the log-probs it gives")
    ap.add_argument("--base", help="one rank: write the base's global tensors here; torchrun: load them from here")
    args = ap.parse_args()
    out = Path(args.worker)
    if "RANK" not in os.environ:
        _env_single()
    import torch
    import torch.distributed as dist

    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    from scalerl_mega.model.config import load_model_preset

    single = int(os.environ["WORLD_SIZE"]) == 1
    vocab = load_model_preset(args.model).vocab_size
    probe = _batch(9, vocab)
    if single:  # first: one process holds one trainer at a time
        base_logp, base_weights = _base_logprobs(args.model, probe)
    trainer = MegatronPolicyTrainer(_cfg(args.model, tp=args.tp, ep=args.ep, sp=args.sp, lora=True))
    res: dict = {}
    if args.base and single:
        torch.save(_global_base(trainer), args.base)
    elif args.base:
        _load_base(trainer, args.base)
    if single:
        res["step0_bitwise"] = bool(torch.equal(trainer.logprobs(probe), base_logp))
        res.update(_frozen_checks(trainer, base_weights))
    _train(trainer, vocab)
    if single:
        res.update(_after_training(trainer, base_weights))
    config, named = trainer.export_adapter()
    logp = trainer.logprobs(probe)
    res.update(adapter_config=config, peft_bytes=trainer.peft_bytes(), model_bytes=trainer.model_bytes())
    if single:  # how far the trained adapters moved the model: the HF + PEFT comparison is not of two base models
        res["adapter_moved_logp_max"] = float(((logp - base_logp).abs() * probe.loss_mask_BT).max())
    saved = {"named": dict(named), "logp": logp, "mask": probe.loss_mask_BT}
    if args.resume_from:  # resharded: the one-rank checkpoint's adapters under this layout
        trainer.load(args.resume_from)
        saved["logp_resumed"] = trainer.logprobs(probe)
    if not dist.is_initialized() or dist.get_rank() == 0:
        res["exported_bytes"] = sum(t.numel() * t.element_size() for _, t in named)
        torch.save(saved, str(out.with_suffix(".pt")))
    if args.hf_check:
        from lora_hf_check import hf_peft_logprobs

        hf = hf_peft_logprobs(trainer, config, named, probe, workdir=out.parent)
        res["hf_vs_megatron_max_abs"] = float(((hf - logp).abs() * probe.loss_mask_BT).max())
    res.update(_roundtrip(trainer, vocab, out))  # with 2 ranks at DP 2: the distributed optimizer's adapter state
    if not dist.is_initialized() or dist.get_rank() == 0:
        out.write_text(json.dumps(res))
    trainer.close()


if __name__ == "__main__":
    main()
