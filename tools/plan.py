#!/usr/bin/env python
"""Per-GPU memory plan for a model + parallel layout (trainer: Megatron-Core; generators: SGLang).

Examples:
  tools/plan.py --layout train_scout       # slurm/train_scout.sh's default layout (scalerl_mega/cluster/layouts.py)
  tools/plan.py --layout train_scout --device h200 --tp 8 --gen-tp 4 --recompute selective  # flags override it
  tools/plan.py --layout train_qwen3_moe GPU_TYPE=h200 MODEL=qwen3_235b_a22b TRAINER_NODES=8 TP=4 PP=2 EP=32 GEN_TP=8
                                           # a `layout[...]` line of the script's header, typed as it stands
  tools/plan.py --model llama3_8b --device h100_80gb --tp 4 --dp 4 --gen-tp 1
  tools/plan.py --model scout_17b16e --device gb200 --tp 4 --pp 1 --dp 4 --ep 4 --gen-tp 2
  tools/plan.py --model qwen3_235b_a22b --tp 4 --pp 2 --ep 4 --recompute full --peft lora --rank 8
                                   # LoRA (peft=lora): frozen bf16 base, optimizer state for the adapters only
                                   # (scalerl_mega/cluster/plan_lora.py)
  tools/plan.py --table            # the table in docs/cluster_and_gpu.md: every model on every device
  tools/plan.py --sync-table       # predicted weight-sync seconds and floors, one vs per-stage senders, SGLang and
                                   # local engines, bf16 and FP8 (scalerl_mega/cluster/sync_model.py; --json: one
                                   # row each)

Settings not given are the Slurm scripts': `--recompute` defaults to the recompute of the script that ships
`--model` (full, except selective for slurm/train_dense.sh's 8B models; cluster/layouts.py script_recompute),
sequence parallel when tp > 1, the distributed optimizer, the FP32 head with the fused CISPO logits, sequence
16,384, micro-batch 1; the report's first line prints what was assumed.

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

from scalerl_mega.config.peft import DEFAULT_TARGETS  # noqa: E402
from scalerl_mega.config.rollout import KV_CACHE_DTYPES, kv_cache_element_bytes  # noqa: E402
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
                state = model.gdn_state_bytes(gen.tp)  # a GDN hybrid's recurrent + conv state
                seqs = pool // (kv_bytes_per_token(model, gen) * seq_len + state)
                cells += [str(gen.tp), f"{grep_.budget_bytes / GiB:.1f}", str(seqs)]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


SYNC_PEERS = {"llama3_8b": "wire floor 0.66 s", "qwen3_30b_a3b": "0.5-1.0 s (NeMo-RL nccl_reshard)",
              "scout_17b16e": "wire floor ~8.7 s", "qwen3_235b_a22b": "3.2-4.9 s (NeMo-RL, miles RDMA P2P)",
              "deepseek_v3_671b": "2.4-2.8 s (field)"}
"""Peer figures (docs/cluster_and_gpu.md cites them): single-NIC wire floors at 25 GB/s, field syncs that move
each receiving rank's own shard (shard-to-shard transfer), not a broadcast of the whole model."""


def sync_rows(links) -> list[dict]:
    """Every shipped layout (`layouts.shipped_layouts`: the scripts' defaults, then the other models of their
    headers) x quantization (none: bf16, fp8: `rollout.quantization=fp8`'s blockwise FP8 projections) x backend
    (sglang, local) x senders (single, per_stage): `--sync-table --json`."""
    from dataclasses import replace

    from scalerl_mega.cluster.layouts import shipped_layouts
    from scalerl_mega.cluster.sync_model import BACKENDS, SENDER_MODES, estimate_sync

    rows = []
    for name, sl in shipped_layouts().items():
        for quantization in ("none", "fp8"):
            for backend in BACKENDS:
                for senders in SENDER_MODES:
                    e = estimate_sync(MODELS[sl.model], sl.train_layout(), replace(links, quantization=quantization),
                                      backend=backend, senders=senders)
                    rows.append({"model": sl.model, "layout": name, "quantization": quantization, "backend": backend,
                                 "senders": senders, "seconds": round(e.seconds, 3), "floor_s": round(e.floor_s, 3),
                                 "bound": e.bound, "groups": e.groups, "max_sender_bytes": e.max_sender_bytes,
                                 "total_bytes": e.total_bytes, "script_senders": sl.sync_senders})
    return rows


MODES = (("sglang", "single"), ("sglang", "per_stage"), ("local", "single"), ("local", "per_stage"))


def sync_table(links) -> str:
    """Markdown tables of docs/cluster_and_gpu.md. bf16: per shipped layout, modelled seconds and the floor each
    mode hits (`seconds / floor bound`), SGLang and local engines, and the mode its script runs. FP8: the bytes
    sent and each mode's seconds in bf16 and under `rollout.quantization=fp8`, side by side."""
    rows = ["| layout | model | tp/pp/ep | GiB sent | groups | SGLang single | SGLang per_stage | local single | "
            "local per_stage | script runs | peers (measured) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    fp8 = ["| layout | model | GiB sent bf16 / FP8 | FP8 / bf16 bytes | SGLang single s bf16 / FP8 | SGLang per_stage "
           "s bf16 / FP8 | local single s bf16 / FP8 | local per_stage s bf16 / FP8 |", "|---|---|---|---|---|---|---|---|"]
    cells: dict[tuple, dict] = {}
    for r in sync_rows(links):
        cells[(r["layout"], r["quantization"], r["backend"], r["senders"])] = r
    from scalerl_mega.cluster.layouts import shipped_layouts

    for name, sl in shipped_layouts().items():
        lay, bf, q = sl.train_layout(), cells[(name, "none", *MODES[1])], cells[(name, "fp8", *MODES[1])]
        modes = [f"{c['seconds']:.2f} / {c['floor_s']:.2f} {c['bound']}" for c in
                 (cells[(name, "none", *m)] for m in MODES)]
        rows.append(f"| {name} | {sl.model} | {lay.tp}/{lay.pp}/{lay.ep} | {bf['total_bytes'] / GiB:.1f} | "
                    f"{bf['groups']} | " + " | ".join(modes) + f" | {sl.sync_senders} | "
                    f"{SYNC_PEERS.get(sl.model, '-')} |")
        secs = [f"{cells[(name, 'none', *m)]['seconds']:.2f} / {cells[(name, 'fp8', *m)]['seconds']:.2f}" for m in MODES]
        fp8.append(f"| {name} | {sl.model} | {bf['total_bytes'] / GiB:.1f} / {q['total_bytes'] / GiB:.1f} | "
                   f"{q['total_bytes'] / bf['total_bytes']:.3f} | " + " | ".join(secs) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(fp8)


KV_CACHE_BYTES = {d: kv_cache_element_bytes(d, model_bytes=2) for d in KV_CACHE_DTYPES}
"""Bytes per cached K or V element under SGLang's `--kv-cache-dtype` (`rollout.kv_cache_dtype`; auto: the model
dtype, bf16)."""
HEADER_KEYS = ("MODEL", "GPU_TYPE", "GPUS_PER_NODE", "TRAINER_NODES", "GEN_TP", "TP", "PP", "EP", "RECOMPUTE")
"""The variables of a script header's `layout[...]` line (`ScriptLayout.with_env` applies them)."""


def header_layout(layout: str | None, settings: list[str]):
    """The `ScriptLayout` of `--layout` under a header line's `KEY=VALUE` settings (None without `--layout`).
    Raises ValueError naming a malformed or unknown setting, or settings given without `--layout`."""
    from scalerl_mega.cluster.layouts import LAYOUTS

    env = {}
    for item in settings:
        key, eq, value = item.partition("=")
        if not eq or key not in HEADER_KEYS:
            raise ValueError(f"{item!r} is not a header setting KEY=VALUE with KEY one of {', '.join(HEADER_KEYS)}")
        env[key] = value
    if env and layout is None:
        raise ValueError(f"{' '.join(settings)}: a header line's settings change a script's defaults; name the "
                         "script with --layout (e.g. --layout train_qwen3_moe)")
    return None if layout is None else LAYOUTS[layout].with_env(env)


def recompute_assumed(args, sl) -> tuple[str, str]:
    """(recompute, where it came from): the flag, else the `--layout`'s, else the script that ships the model."""
    from scalerl_mega.cluster.layouts import script_recompute

    if args.recompute is not None:
        return args.recompute, "given"
    if sl is not None:
        return sl.recompute, f"slurm/{args.layout}.sh's; --recompute to change"
    mode, names = script_recompute(args.model)
    scripts = sorted({n.split("/")[0] for n in names})
    src = f"slurm/{scripts[0]}.sh's, the script that trains {args.model}" if scripts else "train.recompute's default"
    return mode, f"{src}; --recompute to change"


def assumed_line(args, lay: TrainLayout, source: str) -> str:
    """One line naming every setting the plan assumed that a flag may change."""
    sp = "on" if lay.sequence_parallel and lay.tp > 1 else "off"
    logits = "fused CISPO logits" if lay.fused_head else "full logits"
    head = "BF16 head" if args.bf16_head else f"FP32 head, {logits}"
    return (f"assumed: recompute={lay.recompute} ({source}), sequence parallel {sp}, "
            f"distributed optimizer {'off' if args.no_distributed_optimizer else 'on'}, {head}, "
            f"seq_len={lay.seq_len}, micro_batch={lay.micro_batch}, "
            f"tp={lay.tp} pp={lay.pp} dp={lay.dp} ep={lay.ep} ({lay.world} trainer GPUs), gen tp={args.gen_tp}")


def _trainer_memory_fn(args):
    """`plan.trainer_memory`, or with `--peft lora` the LoRA plan (`plan_lora.lora_trainer_memory`) of the
    given rank and targets (their names checked as `peft.targets` is)."""
    if args.peft == "none":
        return trainer_memory
    from scalerl_mega.cluster.plan_lora import lora_trainer_memory
    from scalerl_mega.config.peft import PeftConfig, target_kinds, validate_peft

    peft = PeftConfig(kind="lora", rank=args.rank, targets=[t for t in args.targets.split(",") if t])
    validate_peft(peft)
    kinds = target_kinds(peft.targets)
    return lambda model, lay, dev: lora_trainer_memory(model, lay, dev, rank=peft.rank, kinds=kinds)


def main(argv: list[str] | None = None) -> int:
    from scalerl_mega.cluster.layouts import LAYOUTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", choices=sorted(LAYOUTS),
                    help="a Slurm script's default layout (model, device, TP/PP/DP/EP, recompute, SP, gen TP)")
    ap.add_argument("--model", choices=sorted(MODELS), default="llama3_8b")
    ap.add_argument("--preset", default=None, help="plan a conf/model preset instead of --model (e.g. qwen3_next_80b_a3b: "
                    "a Gated DeltaNet hybrid, its generator holding KV for the full-attention layers and each "
                    "sequence's recurrent + conv state)")
    ap.add_argument("--device", choices=sorted(DEVICES), default="h100_80gb")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--etp", type=int, default=1, help="expert tensor parallel (parallel.etp)")
    ap.add_argument("--bf16-head", action="store_true", help="precision=bf16_head (default: FP32 output layer)")
    ap.add_argument("--no-sequence-parallel", action="store_true")
    ap.add_argument("--no-distributed-optimizer", action="store_true")
    ap.add_argument("--recompute", choices=("none", "selective", "full"), default=None,
                    help="activation recompute (default: the --layout's, else that of the script that ships --model)")
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
    ap.add_argument("--kv-cache-dtype", choices=KV_CACHE_BYTES, default="auto",
                    help="generator KV cache, rollout.kv_cache_dtype (SGLang's --kv-cache-dtype): auto (the model's "
                         "bf16, 2 bytes) | fp8_e4m3 | fp8_e5m2 (1 byte)")
    ap.add_argument("--table", action="store_true", help="print the table of docs/cluster_and_gpu.md and exit")
    ap.add_argument("--trainer-gpus", type=int, default=16, help="for --table: paper App. A.3 uses 16 trainers")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sync-table", action="store_true", help="print the weight-sync table of docs/cluster_and_gpu.md")
    ap.add_argument("--link-gbps", type=float, default=25.0, help="weight sync: one sender's network GB/s")
    ap.add_argument("--gather-gbps", type=float, default=150.0, help="weight sync: intra-node gather GB/s per GPU")
    ap.add_argument("--recv-gbps", type=float, default=25.0, help="weight sync: one receiving engine rank's GB/s")
    ap.add_argument("--peft", choices=("none", "lora"), default="none",
                    help="lora: plan LoRA training (peft=lora): the base frozen, adapters trained")
    ap.add_argument("--rank", type=int, default=8, help="--peft lora: the adapters' rank (peft.rank)")
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                    help="--peft lora: comma-separated peft.targets (default: attention, every MLP and expert)")
    ap.add_argument("settings", nargs="*", metavar="KEY=VALUE",
                    help="with --layout: a header line's settings, e.g. GPU_TYPE=h200 TP=4 (the script's variables)")
    known, _ = ap.parse_known_args(argv)
    try:
        sl = header_layout(known.layout, known.settings)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if sl is not None:  # the script's defaults; flags given on the command line still override them
        lay0 = sl.train_layout()
        ap.set_defaults(model=sl.model, device=sl.gpu_type, tp=lay0.tp, pp=lay0.pp, dp=lay0.dp, ep=lay0.ep,
                        no_sequence_parallel=not lay0.sequence_parallel, gen_tp=sl.gen_tp,
                        nics_per_node=sl.gpus_per_node)
    args = ap.parse_args(argv)

    from scalerl_mega.cluster.sync_model import SyncLinks, predict_sync

    links = SyncLinks(link_gbps=args.link_gbps, gather_gbps=args.gather_gbps, recv_gbps=args.recv_gbps,
                      quantization=args.gen_quantization)
    if args.table:
        print(table(seq_len=args.seq_len, micro_batch=args.micro_batch, trainer_gpus=args.trainer_gpus))
        return 0
    if args.sync_table:
        print(json.dumps(sync_rows(links), indent=1) if args.json else sync_table(links))
        return 0
    model, dev = MODELS[args.model], DEVICES[args.device]
    if args.preset:
        from scalerl_mega.dry_run import model_shape
        from scalerl_mega.model.config import load_model_preset

        try:
            model = model_shape(load_model_preset(args.preset))
        except ValueError as exc:
            print(f"error: --preset: {exc}", file=sys.stderr)
            return 1
        args.model = args.preset
    try:
        args.recompute, recompute_source = recompute_assumed(args, sl)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
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
        quantization=args.gen_quantization, kv_bytes=KV_CACHE_BYTES[args.kv_cache_dtype],
    )
    try:
        memory = _trainer_memory_fn(args)
        trep = memory(model, lay, dev)
        grep_ = generator_memory(model, glay, dev)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out: dict = {"model": model.name, "device": dev.name, "trainer": None, "generator": None,
                 "assumed": {"recompute": lay.recompute, "recompute_source": recompute_source}}
    if not args.json:
        print(assumed_line(args, lay, recompute_source))
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
        print(f"weight sync into SGLang (modelled, {links.link_gbps:g} GB/s per link): one sender {ws['single_sender_s']:.2f} s, "
              f"{ws['senders']} senders {ws['multi_sender_s']:.2f} s (largest sender {ws['max_sender_bytes'] / GiB:.1f} GiB)")
    if not trep.fits:
        status = 2
        sug = smallest_trainer_layout(model, dev, base=lay, memory=memory)
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
