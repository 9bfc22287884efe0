"""Multi-process worker (torchrun, gloo, CPU): gradients of the trainer's Megatron GDN layers against transformers'.

One backward of loss = sum(logits * W) (W fixed random) through the HF model and, for each layout in `--layouts`,
through the trainer's Megatron model loaded from the same checkpoint. Every Gated DeltaNet tensor's gradient
(in_proj, conv1d, A_log, dt_bias, out_norm, out_proj), gathered over tensor parallelism into its full Megatron
tensor, is compared with the HF gradients put through the same (linear) layout map. Rank 0 writes
{layout: {tensor kind: max |diff| / max |HF gradient| over that kind's tensors}} to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hf-dir", required=True)
    p.add_argument("--layouts", nargs="+", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    import transformers
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from scalerl_mega.convert import sharding, tables
    from scalerl_mega.convert.load import load_hf_checkpoint
    from scalerl_mega.convert.model_config import dims_from_model_config, model_config_from_hf
    from scalerl_mega.convert.pipeline import load_hf_config
    from scalerl_mega.model.config import ParallelConfig
    from scalerl_mega.trainer.megatron import models, parallel
    from scalerl_mega.trainer.megatron.global_names import global_params

    torch.manual_seed(0)
    tokens = torch.randint(0, 100, (2, 24))
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32)
    logits = hf(input_ids=tokens).logits
    weight = torch.randn_like(logits)
    (logits * weight).sum().backward()
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}
    # no load-balancing loss: its gradient (Megatron adds it in backward) is not part of HF's logits
    model_cfg = dataclasses.replace(model_config_from_hf(load_hf_config(args.hf_dir), name="tiny"), moe_aux_loss_coeff=0.0)
    dims = dims_from_model_config(model_cfg)
    groups = [g for g in tables.iter_groups(dims) if g.rule.scope == "linear"]
    want = {n: t for g in groups for n, t in tables.hf_to_mcore(g, [hf_grads[h] for h in g.hf], dims=dims,
                                                                   padded_vocab=dims.vocab_size)}
    report: dict = {"tensors": len(want)}
    for spec in args.layouts:
        tp = int(spec[2:])
        pcfg = ParallelConfig(tp=tp, sequence_parallel=tp > 1 and model_cfg.is_moe)
        parallel.init_parallel(pcfg, model=model_cfg)
        gpt, _ = models.build_model(model_cfg, pcfg)
        load_hf_checkpoint(gpt, args.hf_dir, dims=dims)
        out = gpt(tokens, torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens), None)
        full = tensor_parallel.gather_from_tensor_model_parallel_region(out)[..., :dims.vocab_size]
        (full * weight).sum().backward()
        params = global_params(gpt, dims)
        rel: dict[str, float] = {}
        for name, ref in want.items():
            shards = [torch.empty_like(params[name].grad) for _ in range(tp)]
            dist.all_gather(shards, params[name].grad.contiguous(), group=ps.get_tensor_model_parallel_group())
            kind = name.split("self_attention.")[1]
            err = float((sharding.tp_merge(name, shards, dims=dims) - ref).abs().max() / ref.abs().max())
            rel[kind] = max(rel.get(kind, 0.0), err)
        report[spec] = rel
        parallel.teardown_parallel(destroy_process_group=False)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
