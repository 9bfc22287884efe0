"""GPU worker for test_megatron_gpu.py (not a test module): one bf16 MegatronPolicyTrainer step at TP1,
world size 1 over NCCL, with Megatron's local (non-Transformer-Engine) layer spec; then the HF weight export
(--mode step, writes --out/result.json). --mode resume: save -> load -> next steps (writes --out/resume.json):
the trainer takes STEPS steps, saves and takes two more (the reference); a fresh trainer loads the
checkpoint and takes the same two; a control loads only the model (fresh Adam state). Megatron's inner
optimizer is whatever it selects here: TransformerEngine's FusedAdam when TE is installed (the optimizer a
resume used to crash with KeyError 'step', optimizer_state.prime_fresh_optimizer).

Run by the test in a subprocess so that the NCCL process group and Megatron's global state live and die
with it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STEPS = 3


def _batch(vocab: int, *, seed: int, prompt_len: int):
    import torch

    from scalerl_mega.types import TrainBatch

    g = torch.Generator().manual_seed(seed)
    B, T = 4, 64
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[:, :prompt_len] = 0.0
    mask[:, -1] = 0.0
    return TrainBatch(input_ids_BT=ids, position_ids_BT=torch.arange(T).expand(B, T).contiguous(),
                      loss_mask_BT=mask, targets_BT=torch.roll(ids, -1, 1) * (mask > 0).long(),
                      gen_logp_BT=torch.zeros(B, T), advantages_B=torch.zeros(B), prompt_index_B=torch.arange(B),
                      token_weights_BT=mask / mask.sum())


def resume(out: Path) -> None:
    from scalerl_mega.trainer.megatron import checkpoint, models
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    models.te_available = lambda: False  # local layer spec (the optimizer is still Megatron's choice)
    cfg = MegatronConfig(model=load_model_preset("tiny_dense"), parallel=ParallelConfig(micro_batch_size=2),
                         optim=OptimConfig(lr=5e-3, adam_eps=1e-4), params_dtype="bfloat16")
    batch = _batch(cfg.model.vocab_size, seed=5, prompt_len=0)
    ckpt = str(out / "ckpt")
    a = MegatronPolicyTrainer(cfg)
    subs = getattr(a.optimizer, "chained_optimizers", None) or [a.optimizer]
    res: dict = {"inner_optimizers": sorted({f"{type(s.optimizer).__module__}.{type(s.optimizer).__name__}"
                                             for s in subs})}
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["step", "resume"], default="step")
    args = ap.parse_args()
    out = Path(args.out)
    if args.mode == "resume":
        resume(out)
        return

    import torch
    import torch.distributed as dist

    from scalerl_mega.trainer.megatron.global_names import unwrap
    from scalerl_mega.trainer.megatron import models
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    models.te_available = lambda: False  # the local spec even where Transformer Engine is installed
    model = load_model_preset("tiny_dense")
    # bf16 body, FP32 head and FP32 main weights: the precision API (MegatronConfig.params_dtype)
    cfg = MegatronConfig(model=model, parallel=ParallelConfig(micro_batch_size=2),
                         optim=OptimConfig(lr=5e-3, warmup_steps=1, adam_eps=1e-4), params_dtype="bfloat16")
    trainer = MegatronPolicyTrainer(cfg)
    gpt = unwrap(trainer.chunks)[0]
    res: dict = {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "device": trainer.info.device,
                 "ln_vocab": math.log(model.vocab_size)}
    res["body_dtypes"] = sorted({str(p.dtype) for n, p in gpt.named_parameters() if "output_layer" not in n})
    res["param_devices"] = sorted({p.device.type for p in gpt.parameters()})

    batch = _batch(model.vocab_size, seed=3, prompt_len=16)
    steps = [trainer.train_step(batch) for _ in range(STEPS)]
    res["loss"] = [m["loss"] for m in steps]
    res["grad_norm"] = [m["grad_norm"] for m in steps]

    # Weight export: the tensors must stay on the GPU (NCCL weight sync cannot send CPU tensors) and go out
    # as bf16. Cast here only if the exporter did not (the intended exporter casts itself; both recorded).
    exported = list(trainer.export_hf_weights(dtype="bfloat16"))  # what the loop asks for (generator dtype)
    res["export_count"] = len(exported)
    res["export_devices"] = sorted({t.device.type for _, t in exported})
    res["export_dtypes"] = sorted({str(t.dtype) for n, t in exported if n != "lm_head.weight"})
    res["head_dtype"] = str(dict(exported)["lm_head.weight"].dtype)
    emb = dict(exported)["model.embed_tokens.weight"]
    emb16 = emb if emb.dtype == torch.bfloat16 else emb.to(torch.bfloat16)
    live = gpt.embedding.word_embeddings.weight.detach()[: emb16.shape[0]].to(torch.bfloat16)
    res["embed_shape"] = list(emb16.shape)
    res["embed_equal"] = bool(torch.equal(emb16.to(live.device), live))
    trainer.close()
    (out / "result.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
