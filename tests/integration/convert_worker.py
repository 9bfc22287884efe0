"""Multi-process worker for the converter integration tests (launched with torchrun, gloo, CPU).

For each layout in ``--layouts`` (e.g. ``tp2 ep2 pp2``), in one launch: build the trainer's
Megatron model (``models.build_model``) for the HF config in ``--hf-dir``, load the converter
checkpoint ``--ckpt``, compute logits on fixed random tokens and compare them with the HF
``transformers`` model's logits (computed here, on rank 0); then run ``export_hf_weights`` and
compare every exported tensor with the HF checkpoint. Rank 0 writes a JSON report to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os


def hf_logits(hf_dir: str, tokens):
    import torch
    import transformers

    from scalerl_mega.convert.hf_layout import CONDITIONAL, read_layout

    cls = transformers.Llama4ForConditionalGeneration if read_layout(hf_dir).kind == CONDITIONAL else transformers.AutoModelForCausalLM
    model = cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(input_ids=tokens).logits


def megatron_logits(gpt, tokens):
    """Full-vocab logits [b, s, V_padded] on the last stage (None elsewhere); manual PP send/recv."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    b, s = tokens.shape
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    with torch.no_grad():
        if not ps.is_pipeline_first_stage():
            h = gpt.config.hidden_size
            seq = s // ps.get_tensor_model_parallel_world_size() if gpt.config.sequence_parallel else s
            recv = torch.empty(seq, b, h)
            dist.recv(recv, src=ps.get_pipeline_model_parallel_prev_rank())
            gpt.set_input_tensor(recv)
        out = gpt(tokens, pos, None)
        if not ps.is_pipeline_last_stage():
            dist.send(out.contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())
            return None
        return tensor_parallel.gather_from_tensor_model_parallel_region(out)


def run_layout(spec: str, args, tokens, ref_logits, hf_tensors) -> dict:
    import torch
    import torch.distributed as dist

    from scalerl_mega.convert.load import load_hf_checkpoint, load_megatron_checkpoint
    from scalerl_mega.convert.model_config import dims_from_model_config, model_config_from_hf
    from scalerl_mega.trainer.megatron import models, parallel
    from scalerl_mega.model.config import ParallelConfig
    from scalerl_mega.trainer.megatron.export import export_hf_weights

    from scalerl_mega.convert.pipeline import load_hf_config

    model_cfg = model_config_from_hf(load_hf_config(args.hf_dir), name="tiny")
    sizes = {k: 1 for k in ("tp", "pp", "ep")}
    parts = spec.split("_")
    for part in parts:
        if part != "hf":  # "<layout>_hf": load the HF checkpoint directly instead of the converted one
            sizes[part[:2]] = int(part[2:])
    pcfg = ParallelConfig(**sizes, sequence_parallel=sizes["tp"] > 1 and model_cfg.is_moe, moe_token_dispatcher=args.dispatcher)
    parallel.init_parallel(pcfg, model=model_cfg)
    gpt, _ = models.build_model(model_cfg, pcfg)
    gpt.eval()
    if "hf" in parts:
        load_hf_checkpoint(gpt, args.hf_dir, dims=dims_from_model_config(model_cfg))
    else:
        load_megatron_checkpoint(gpt, args.ckpt, dims=dims_from_model_config(model_cfg))
    logits = megatron_logits(gpt, tokens)
    result: dict = {"layout": spec}
    from megatron.core import parallel_state as ps

    if logits is not None and ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0:
        v = ref_logits.shape[-1]
        result["logits_max_abs_diff"] = float((logits[..., :v] - ref_logits).abs().max())
        result["logits_ref_abs_max"] = float(ref_logits.abs().max())
    exported = {}
    order = []
    for name, t in export_hf_weights(gpt, model_cfg):
        order.append(name)
        exported[name] = t
    mism = [n for n, t in exported.items() if not (n in hf_tensors and hf_tensors[n].shape == t.shape and torch.equal(hf_tensors[n], t))]
    result["exported"] = len(exported)
    result["export_order"] = order
    result["export_mismatch"] = mism
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    parallel.teardown_parallel(destroy_process_group=False)
    return {"ranks": gathered, "dims_ok": dims_from_model_config(model_cfg) is not None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hf-dir", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--layouts", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dispatcher", default="alltoall")
    p.add_argument("--seq", type=int, default=44)  # > 5 chunks of 8, the last one ragged
    args = p.parse_args()

    import torch

    from scalerl_mega.convert.st_io import SafetensorsDir

    from scalerl_mega.convert.hf_layout import read_layout

    torch.manual_seed(0)
    hf = read_layout(args.hf_dir)
    tokens = torch.randint(0, hf.text_config["vocab_size"], (2, args.seq))
    ref = hf_logits(args.hf_dir, tokens)
    src = SafetensorsDir(args.hf_dir)  # the text model's tensors under their causal-layout names
    hf_tensors = {n[len(hf.prefix):]: src.get(n) for n in src.names() if n.startswith(hf.prefix) and not hf.is_non_text(n)}
    report = {layout: run_layout(layout, args, tokens, ref, hf_tensors) for layout in args.layouts}
    import torch.distributed as dist

    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
