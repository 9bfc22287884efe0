"""torchrun worker (gloo, CPU) of tests/integration/test_multi_sender_sync.py: multi-sender weight sync
from a Megatron Qwen3-MoE trainer to one local engine (or, with `--sglang-url`, one or more real SGLang
servers: tests/sglang/test_real_multi_sender_sync.py), per layout in `--layouts`
(pp2, ep2: 2 ranks; pp2ep2: 4 ranks). Per layout: load the HF checkpoint into the trainer's model,
shift every parameter by a layout-specific constant (so each sync changes the engine), take the
single-sender export (`export_to_rank0`) as the reference, then sync with one sender per stage and
per expert-parallel rank and read the engine's fingerprint (SGLang: the server's per-tensor SHA-256s after
the multi-sender sync, then after a one-sender push of the reference export). Rank 0 writes a JSON report to `--out`."""

from __future__ import annotations

import argparse
import json


def _loaded_digest(engine_hf_dir: str, named) -> str:
    """Fingerprint of the engine's model after loading `named` as the engine does (checkpoint names into
    its parameters, `hf_params.checkpoint_target`): the reference an engine's digest must equal."""
    import torch

    from scalerl_mega.rollout.hf_params import checkpoint_target
    from scalerl_mega.rollout.local_spec import LocalModelSpec, build_model
    from scalerl_mega.weight_sync import weights_sha256

    model = build_model(LocalModelSpec(arch="qwen3_moe", path=engine_hf_dir))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in named:
            checkpoint_target(params, name).copy_(t)
    return weights_sha256(model.named_parameters())


def server_checksums(url: str) -> dict[str, str]:
    """SHA-256 of every parameter an SGLang server holds (0.5.23 `/weights_checker` action `checksum`, its
    fused names; one TP rank here)."""
    import requests

    r = requests.post(url.rstrip("/") + "/weights_checker", json={"action": "checksum"}, timeout=120)
    r.raise_for_status()
    (rank,) = r.json()["ranks"]
    return rank["checksums"]


def _engine(args):
    """Rank 0's engine: a local engine process, or the SGLang server at --sglang-url."""
    from scalerl_mega.weight_sync import WeightSyncConfig

    sync = WeightSyncConfig(backend="gloo", timeout_s=args.timeout, bucket_bytes=args.bucket_bytes,
                            group_name=f"ref{args.group_prefix}-" + "-".join(args.layouts))  # a server keeps every group's name
    if args.sglang_url:
        from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer

        return SGLangRolloutEngine([SGLangServer.attach(u) for u in args.sglang_url.split(",")],
                                   config=SGLangEngineConfig(pause_mode="in_place", control_timeout_s=args.timeout,
                                                             sync=sync))
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine

    engines = [LocalRolloutEngine(LocalEngineConfig(model=LocalModelSpec(arch="qwen3_moe", path=args.engine_hf_dir),
                                                    sync=sync)) for _ in range(args.engines)]
    if len(engines) == 1:
        return engines[0]
    from scalerl_mega.build import EngineSet

    return EngineSet(engines)


def run_layout(spec: str, index: int, args, engine) -> dict:
    import torch
    import torch.distributed as dist

    from scalerl_mega.convert.load import load_hf_checkpoint
    from scalerl_mega.convert.model_config import dims_from_model_config, model_config_from_hf
    from scalerl_mega.convert.pipeline import load_hf_config
    from scalerl_mega.model.config import ParallelConfig
    from scalerl_mega.weight_sync.multi import bucket_metas, open_sender_group, send_buckets, sync_metrics
    from scalerl_mega.weight_sync.plan import SenderLayout, plan_buckets, receive_seqs, spec_bytes
    from scalerl_mega.trainer.megatron import models, parallel
    from scalerl_mega.trainer.megatron.export import export_to_rank0
    from scalerl_mega.trainer.megatron.export_senders import ExportMemory, export_own, my_sender, sender_plan
    from scalerl_mega.weight_sync import free_port, weights_sha256

    sizes = {"pp": 1, "ep": 1}
    for part in ("pp", "ep"):
        if part in spec:
            sizes[part] = int(spec[spec.index(part) + 2])
    model_cfg = model_config_from_hf(load_hf_config(args.hf_dir), name="tiny")
    pcfg = ParallelConfig(**sizes)
    parallel.init_parallel(pcfg, model=model_cfg)
    gpt, _ = models.build_model(model_cfg, pcfg)
    load_hf_checkpoint(gpt, args.hf_dir, dims=dims_from_model_config(model_cfg))
    with torch.no_grad():
        for p in gpt.parameters():
            p.add_(0.125 * (index + 1 + args.shift_offset))
    rank = dist.get_rank()
    ref = list(export_to_rank0(gpt, model_cfg))
    ref_digest = _loaded_digest(args.engine_hf_dir, ref) if rank == 0 and not args.sglang_url else None

    version = index + 1
    layout = SenderLayout(pp=sizes["pp"], ep=sizes["ep"], base_name=f"{args.group_prefix}-{spec}")
    plan = {g: plan_buckets(s, bucket_bytes=args.bucket_bytes)
            for g, s in sender_plan(model_cfg, layout, dtype=None, params_dtype="float32").items()}
    me = my_sender(layout)
    me = me if me is not None and me.group_name in plan else None  # an expert pool with nothing to send
    url = f"tcp://127.0.0.1:{free_port()}" if me else None
    urls: list = [None] * dist.get_world_size()
    dist.all_gather_object(urls, (me.group_name, url) if me else None)
    seqs = receive_seqs(dims_from_model_config(model_cfg), layout, plan)
    metas = {g: bucket_metas(b, version=version, flattened=args.flattened, seqs=seqs[g]) for g, b in plan.items()}
    if rank == 0:  # the manifest check of the whole update, before anything is sent
        engine.check_plan(metas, version=version)
        engine.join_groups(dict(u for u in urls if u))
    group = (open_sender_group(me.group_name, url, world_size=1 + args.engines, backend="gloo", timeout_s=args.timeout)
             if me else None)
    if rank == 0:
        engine.wait_groups()
        engine.announce_groups(metas, version=version)
    dist.barrier()
    memory = ExportMemory()
    stream = export_own(gpt, model_cfg, layout, memory=memory)
    stats: dict = {"group": ""}
    if me:
        sent = send_buckets(group, stream, buckets=plan[me.group_name], group_name=me.group_name, version=version,
                            timeout_s=args.timeout, flattened=args.flattened)
        stats = {"group": me.group_name, "bytes": sent.bytes, "peak_bucket_bytes": sent.peak_bucket_bytes,
                 "names": sum((m.names for m in metas[me.group_name]), [])}
    else:
        for _ in stream:
            pass
    stats["transient_bytes"] = memory.peak_bytes + stats.get("peak_bucket_bytes", 0)
    stats["rank"] = rank
    all_stats: list = [None] * dist.get_world_size()
    dist.all_gather_object(all_stats, stats)
    result: dict = {"layout": spec}
    if rank == 0:
        engine.finish_groups(metas, version=version)
        if args.sglang_url:  # every server's own per-tensor SHA-256s, then after the one-sender push of the export
            urls = args.sglang_url.split(",")
            result["engine_digests"] = [server_checksums(u) for u in urls]
            digest = {"weights_sha256": result["engine_digests"][0], "version": engine.version}
            engine.update_weights(iter(ref), version=100 + version)
            result["ref_digests"] = [server_checksums(u) for u in urls]
            ref_digest = result["ref_digests"][0]
        else:  # every engine holds the same weights and version
            every = [e.weights_digest() for e in getattr(engine, "engines", [engine])]
            digest = every[0]
            result["engine_digests"] = [d["weights_sha256"] for d in every]
            result["engine_versions"] = [d["version"] for d in every]
        result.update(ref_digest=ref_digest, engine_digest=digest["weights_sha256"], version=digest["version"],
                      stats=all_stats, metrics=sync_metrics(all_stats, seconds=0.0),
                      plan_bytes={g: sum(m.num_bytes for m in ms) for g, ms in metas.items()},
                      dense_bytes={g: sum(spec_bytes(s) for b in bs for s in b if ".experts." not in s.name)
                                   for g, bs in plan.items()})
    del ref
    dist.barrier()
    parallel.teardown_parallel(destroy_process_group=False)
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hf-dir", required=True)
    p.add_argument("--engine-hf-dir", required=True)
    p.add_argument("--layouts", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--bucket-bytes", type=int, default=16384)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--flattened", action="store_true")
    p.add_argument("--shift-offset", type=int, default=0,
                   help="layout i shifts every parameter by 0.125 * (i + 1 + offset): a server that earlier tests "
                        "already synced gets weights it has not held")
    p.add_argument("--group-prefix", default="wu", help="group names' prefix (a server keeps every name it joined)")
    p.add_argument("--engines", type=int, default=1, help="local engine processes (several: build.EngineSet)")
    p.add_argument("--sglang-url", default="",
                   help="sync into these real SGLang servers (comma-separated, TP 1 each) instead of a local engine")
    args = p.parse_args()
    if args.sglang_url:
        args.engines = len(args.sglang_url.split(","))  # each group: the sender and every server's one rank

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    engine = None
    report = {}
    try:
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            engine = _engine(args)
            report["engine_digest_before"] = (server_checksums(args.sglang_url.split(",")[0]) if args.sglang_url else
                                              getattr(engine, "engines", [engine])[0].weights_digest()["weights_sha256"])
        for i, layout in enumerate(args.layouts):
            report[layout] = run_layout(layout, i, args, engine)
    finally:
        if engine is not None:
            engine.close()
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
