#!/usr/bin/env python
"""Per-GPU memory plan for a model + parallel layout (trainer: Megatron-Core; generators: SGLang).

Examples:
  tools/plan.py --layout train_scout       # slurm/train_scout.sh's default layout (scalerl_mega/cluster/layouts.py)
  tools/plan.py --layout train_scout --device h200 --tp 8 --gen-tp 4 --recompute selective  # flags override it
  tools/plan.py --model llama3_8b --device h100_80gb --tp 4 --dp 4 --gen-tp 1
  tools/plan.py --model scout_17b16e --device gb200 --tp 4 --pp 1 --dp 4 --ep 4 --gen-tp 2
  tools/plan.py --table            # the table in docs/cluster_and_gpu.md: every model on every device
  tools/plan.py --sync-table       # predicted weight-sync seconds, one vs many senders (scalerl_mega/cluster/sync_model.py)

The trainer figure is the one the meta-device dry run (`dry_run=true`) and the Slurm launch check give for the
same layout (scalerl_mega/dry_run.py trainer_plan; the default recipe: CISPO with the fused FP32 head).

Exit status: 0 when the layout fits, 2 when it does not (the smallest layout that fits is printed),
1 on invalid arguments. Byte counts and formulas: scalerl_mega/cluster/plan.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalerl_mega.cluster.plan import (  # noqa: E402
    DEVICES,
    MODELS,
    GiB,
    GenLayout,
    TrainLayout,
    format_report,
    generator_memory,
    smallest_generator_layout,
    smallest_trainer_layout,
    trainer_memory,
)


def _layout_str(lay: TrainLayout) -> str:
    etp = f" etp={lay.etp}" if lay.etp != 1 else ""
    return f"tp={lay.tp} pp={lay.pp} dp={lay.dp} ep={lay.ep}{etp} ({lay.world} GPUs)"


def table(*, seq_len: int, micro_batch: int, trainer_gpus: int) -> str:
    """Markdown table: smallest fitting trainer layout, layout at ``trainer_gpus`` GPUs, generator TP."""
    from scalerl_mega.cluster.plan import generator_weight_bytes, kv_bytes_per_token

    rows = [
        "| model | device | smallest trainer layout | GiB/GPU | trainer layout at "
        f"{trainer_gpus} GPUs | GiB/GPU | generator TP | gen GiB/GPU (weights + KV pool) | full seqs in KV |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = TrainLayout(seq_len=seq_len, micro_batch=micro_batch, fused_head=True)
    gbase = GenLayout(seq_len=seq_len)
    for model in MODELS.values():
        for dev in DEVICES.values():
            small = smallest_trainer_layout(model, dev, base=base, max_gpus=256)
            at = smallest_trainer_layout(model, dev, base=base, max_gpus=trainer_gpus, world=trainer_gpus)
            gen = smallest_generator_layout(model, dev, base=gbase)
            cells = [model.name, dev.name]
            for lay in (small, at):
                if lay is None:
                    cells += ["none fits", "-"]
                else:
                    rep = trainer_memory(model, lay, dev)
                    cells += [_layout_str(lay), f"{rep.total_bytes / GiB:.1f}"]
            if gen is None:
                cells += ["none fits", "-", "-"]
            else:
                grep_ = generator_memory(model, gen, dev)
                pool = grep_.budget_bytes - generator_weight_bytes(model, gen)
                seqs = pool // (kv_bytes_per_token(model, gen) * seq_len)
                cells += [str(gen.tp), f"{grep_.budget_bytes / GiB:.1f}", str(seqs)]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


SYNC_PEERS = {"llama3_8b": "wire floor 0.66 s", "qwen3_30b_a3b": "0.5-1.0 s (NeMo-RL nccl_reshard)",
              "scout_17b16e": "wire floor ~8.7 s", "qwen3_235b_a22b": "3.2-4.9 s (NeMo-RL, miles RDMA P2P)",
              "deepseek_v3_671b": "2.4-2.8 s (field)"}
"""Peer figures (docs/cluster_and_gpu.md cites them): single-NIC wire floors at 25 GB/s, field multi-sender syncs."""


def sync_rows() -> list[tuple[str, str, int, TrainLayout]]:
    """(row label, model, GPUs per node, trainer layout) of every shipped layout (`layouts.shipped_layouts`:
    the scripts' defaults, then the other models of their headers)."""
    from scalerl_mega.cluster.layouts import shipped_layouts

    return [(name, sl.model, sl.gpus_per_node, sl.train_layout()) for name, sl in shipped_layouts().items()]


def sync_table(links) -> str:
    """Markdown table of docs/cluster_and_gpu.md: predicted sync seconds per layout, one vs many senders."""
    from dataclasses import replace as _replace

    from scalerl_mega.cluster.sync_model import predict_sync

    rows = ["| layout | model | tp/pp/ep | GiB sent | one sender s | senders | largest sender GiB | "
            "many senders s | peers |", "|---|---|---|---|---|---|---|---|---|"]
    for label, name, gpn, lay in sync_rows():
        pred = predict_sync(MODELS[name], lay, _replace(links, nics_per_node=gpn))
        rows.append(f"| {label} | {name} | {lay.tp}/{lay.pp}/{lay.ep} | {pred.total_bytes / GiB:.1f} | "
                    f"{pred.single_sender_s:.2f} | {pred.senders} | {pred.max_sender_bytes / GiB:.1f} | "
                    f"{pred.multi_sender_s:.2f} | {SYNC_PEERS.get(name, '-')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from scalerl_mega.cluster.layouts import LAYOUTS, RECOMPUTE_DEFAULT

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", choices=sorted(LAYOUTS),
                    help="a Slurm script's default layout (model, device, TP/PP/DP/EP, recompute, SP, gen TP)")
    ap.add_argument("--model", choices=sorted(MODELS), default="llama3_8b")
    ap.add_argument("--device", choices=sorted(DEVICES), default="h100_80gb")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--etp", type=int, default=1, help="expert tensor parallel (parallel.etp)")
    ap.add_argument("--bf16-head", action="store_true", help="precision=bf16_head (default: FP32 output layer)")
    ap.add_argument("--no-sequence-parallel", action="store_true")
    ap.add_argument("--no-distributed-optimizer", action="store_true")
    ap.add_argument("--recompute", choices=("none", "selective", "full"), default=RECOMPUTE_DEFAULT)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=16384, help="paper Sec. 2: 16,384 tokens")
    ap.add_argument("--num-microbatches", type=int, default=None)
    ap.add_argument("--logits-chunk-tokens", type=int, default=None,
                    help="logit rows the head holds at once (default: the fused CISPO head's chunk for V / tp)")
    ap.add_argument("--full-logits", action="store_true",
                    help="the logits path (a loss other than CISPO, an IS correction, temperature != 1): all N rows")
    ap.add_argument("--gen-tp", type=int, default=1)
    ap.add_argument("--mem-fraction-static", type=float, default=0.85)
    ap.add_argument("--min-seqs", type=int, default=16)
    ap.add_argument("--gen-quantization", choices=("none", "fp8"), default="none",
                    help="generator weights: none (bf16) | fp8 (blockwise FP8 projections, rollout.quantization=fp8)")
    ap.add_argument("--table", action="store_true", help="print the table of docs/cluster_and_gpu.md and exit")
    ap.add_argument("--trainer-gpus", type=int, default=16, help="for --table: paper App. A.3 uses 16 trainers")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sync-table", action="store_true", help="print the weight-sync table of docs/cluster_and_gpu.md")
    ap.add_argument("--link-gbps", type=float, default=25.0, help="weight sync: one sender's network GB/s")
    ap.add_argument("--gather-gbps", type=float, default=150.0, help="weight sync: intra-node gather GB/s per GPU")
    ap.add_argument("--nics-per-node", type=int, default=None,
                    help="weight sync: NICs an engine node receives through (default: the layout's GPUs per node, or 8)")
    known, _ = ap.parse_known_args(argv)
    if known.layout:  # the script's defaults; flags given on the command line still override them
        sl = LAYOUTS[known.layout]
        lay0 = sl.train_layout()
        ap.set_defaults(model=sl.model, device=sl.gpu_type, tp=lay0.tp, pp=lay0.pp, dp=lay0.dp, ep=lay0.ep,
                        recompute=lay0.recompute, no_sequence_parallel=not lay0.sequence_parallel, gen_tp=sl.gen_tp)
    args = ap.parse_args(argv)

    from scalerl_mega.cluster.sync_model import SyncLinks, predict_sync

    nics = args.nics_per_node or (LAYOUTS[args.layout].gpus_per_node if args.layout else 8)
    links = SyncLinks(link_gbps=args.link_gbps, gather_gbps=args.gather_gbps, nics_per_node=nics)
    if args.table:
        print(table(seq_len=args.seq_len, micro_batch=args.micro_batch, trainer_gpus=args.trainer_gpus))
        return 0
    if args.sync_table:
        print(sync_table(links))
        return 0
    model, dev = MODELS[args.model], DEVICES[args.device]
    lay = TrainLayout(
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        ep=args.ep,
        etp=args.etp,
        fp32_head=not args.bf16_head,
        sequence_parallel=not args.no_sequence_parallel,
        distributed_optimizer=not args.no_distributed_optimizer,
        recompute=args.recompute,
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        num_microbatches=args.num_microbatches,
        logits_chunk_tokens=args.logits_chunk_tokens,
        fused_head=not (args.full_logits or args.bf16_head),  # build.use_fused_cispo: the default recipe's head
    )
    glay = GenLayout(
        tp=args.gen_tp, seq_len=args.seq_len, mem_fraction_static=args.mem_fraction_static, min_seqs=args.min_seqs,
        quantization=args.gen_quantization,
    )
    try:
        trep = trainer_memory(model, lay, dev)
        grep_ = generator_memory(model, glay, dev)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out: dict = {"model": model.name, "device": dev.name, "trainer": None, "generator": None}
    try:
        out["weight_sync"] = predict_sync(model, lay, links).as_json()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    status = 0
    for key, rep in (("trainer", trep), ("generator", grep_)):
        out[key] = {"components_bytes": rep.components, "total_bytes": rep.total_bytes,
                    "budget_bytes": rep.budget_bytes, "fits": rep.fits, "notes": rep.notes}
        if not args.json:
            print(format_report(rep))
    if not args.json:
        ws = out["weight_sync"]
        print(f"weight sync (modelled, {links.link_gbps:g} GB/s per sender): one sender {ws['single_sender_s']:.2f} s, "
              f"{ws['senders']} senders {ws['multi_sender_s']:.2f} s (largest sender {ws['max_sender_bytes'] / GiB:.1f} GiB)")
    if not trep.fits:
        status = 2
        sug = smallest_trainer_layout(model, dev, base=lay)
        out["trainer_suggestion"] = None if sug is None else asdict(sug)
        if not args.json:
            msg = "none up to 1024 GPUs" if sug is None else _layout_str(sug)
            print(f"REFUSED: trainer layout {_layout_str(lay)} does not fit on {dev.name}; smallest that fits: {msg}")
    if not grep_.fits:
        status = 2
        gsug = smallest_generator_layout(model, dev, base=replace(glay, tp=1))
        out["generator_suggestion"] = None if gsug is None else asdict(gsug)
        if not args.json:
            msg = "none up to tp=8" if gsug is None else f"gen tp={gsug.tp}"
            print(f"REFUSED: generator tp={glay.tp} does not fit on {dev.name}; smallest that fits: {msg}")
    if args.json:
        print(json.dumps(out, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
