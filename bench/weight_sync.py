"""Weight sync trainer process -> local engine process over gloo: per-tensor vs bucketed.

Per-tensor = one announce + broadcast + acknowledgement per tensor (one SGLang
/update_weights_from_distributed call per tensor). Bucketed = 512 MiB buckets (default), with
per-tensor broadcasts inside a bucket or one flattened uint8 tensor. Target: bucketed >= 3x faster
for a model with >= 100 tensors. Prints medians of `--repeats` syncs and the ratios.

    .venv/bin/python bench/weight_sync.py [--layers 12] [--hidden 256] [--repeats 3]

`--senders 1,2,4`: one sender vs several (weight_sync/multi.py), at the sizes `--hiddens 128,256,512`: the
model's tensors are split into contiguous parts (as pipeline stages split layers), each sent by its own process
over its own group, all at once, into one local engine that receives every group at once. Every sender holds its
part already (no gather: the wire and the receiver only). Prints the median of `--repeats` syncs per size and
sender count and the ratio against the one-sender baseline measured in the same run.

`--sglang-servers 1,2` (with `--senders 1,2`): the same into real SGLang servers on CPU (.venv-sglang, launched as
tests/sglang/ does), a Llama of each `--hiddens` size written under `--models-dir`; every server takes the groups'
buckets one at a time in the one shared order. Beside each ratio the weight-sync model's prediction for the same
bytes (cluster/sync_model.py: no gathers here, so both modes move every byte through each server one group at a
time: 1.00x; bucket count and HTTP round trips, which it leaves out, are what the measurement adds).
"""

from __future__ import annotations

import argparse
import statistics
import time


def _sender_main(conn) -> None:
    """A sender process: ("group", name, url) opens a group; ("send", name, version, named, buckets) sends."""
    import torch

    from scalerl_mega.weight_sync.multi import open_sender_group, send_buckets

    torch.set_num_threads(1)
    groups = {}
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            return
        if msg[0] == "group":
            groups[msg[1]] = open_sender_group(msg[1], msg[2], world_size=msg[3], backend="gloo", timeout_s=120)
            conn.send("ok")
        elif msg[0] == "send":
            _, name, version, named, buckets = msg
            conn.send("ready")
            conn.recv()  # go
            send_buckets(groups[name], iter(named), buckets=buckets, group_name=name, version=version, timeout_s=120)
            conn.send("sent")


def _time_senders(engine, weights, *, counts: list[int], pipes, repeats: int, tag: str) -> dict[int, float]:
    """Median seconds of a sync of `weights` split over n sender processes (n in `counts`) into `engine`."""
    from scalerl_mega.weight_sync import DEFAULT_BUCKET_BYTES, free_port, spec_of
    from scalerl_mega.weight_sync.multi import bucket_metas
    from scalerl_mega.weight_sync.plan import plan_buckets

    out = {}
    for n in counts:
        step = -(-len(weights) // n)
        parts = {f"{tag}-n{n}-s{i}": weights[i * step:(i + 1) * step] for i in range(n)}
        buckets = {g: plan_buckets([spec_of(a, t) for a, t in part], bucket_bytes=DEFAULT_BUCKET_BYTES)
                   for g, part in parts.items()}
        urls = {g: f"tcp://127.0.0.1:{free_port()}" for g in parts}
        engine.join_groups(urls)
        for (conn, _), g in zip(pipes, parts):
            conn.send(("group", g, urls[g], engine.group_world_size))
        engine.wait_groups()
        assert all(conn.recv() == "ok" for (conn, _), _g in zip(pipes, parts))
        times = []
        for r in range(repeats + 1):  # the first run warms up
            version = r + 1
            metas = {g: bucket_metas(b, version=version, flattened=False) for g, b in buckets.items()}
            for (conn, _), g in zip(pipes, parts):
                conn.send(("send", g, version, parts[g], buckets[g]))
            assert all(conn.recv() == "ready" for (conn, _), _g in zip(pipes, parts))
            t0 = time.perf_counter()
            engine.announce_groups(metas, version=version)
            for (conn, _), _g in zip(pipes, parts):
                conn.send("go")
            engine.finish_groups(metas, version=version)
            assert all(conn.recv() == "sent" for (conn, _), _g in zip(pipes, parts))
            times.append(time.perf_counter() - t0)
        out[n] = statistics.median(times[1:])
    return out


def _sender_pool(n: int):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(n)]
    procs = [ctx.Process(target=_sender_main, args=(child,), daemon=True) for _, child in pipes]
    for p in procs:
        p.start()
    return pipes, procs


def _stop_pool(pipes, procs) -> None:
    for conn, _ in pipes:
        conn.send(("stop",))
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()


def multi_sender(args, cfg) -> None:
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine, build_model
    from scalerl_mega.weight_sync import WeightSyncConfig

    counts = [int(x) for x in args.senders.split(",")]
    pipes, procs = _sender_pool(max(counts))
    try:
        for hidden in [int(x) for x in args.hiddens.split(",")]:
            spec = LocalModelSpec(arch="llama", config=dict(cfg, hidden_size=hidden, intermediate_size=4 * hidden),
                                  init_seed=0)
            weights = [(n, t.contiguous()) for n, t in build_model(spec, device="cpu").state_dict().items()]
            nbytes = sum(t.numel() * t.element_size() for _, t in weights)
            engine = LocalRolloutEngine(LocalEngineConfig(model=spec, core=CoreConfig(max_batch=1, max_seq_len=16),
                                                          sync=WeightSyncConfig(backend="gloo", timeout_s=120)))
            try:
                med = _time_senders(engine, weights, counts=counts, pipes=pipes, repeats=args.repeats,
                                    tag=f"h{hidden}")
            finally:
                engine.close()
            for n in counts:
                print(f"hidden {hidden:4d} ({nbytes / 2**20:6.1f} MiB)  senders {n}  median {med[n] * 1e3:8.1f} ms  "
                      f"({nbytes / med[n] / 2**20:7.1f} MiB/s)  vs {counts[0]} sender(s): {med[counts[0]] / med[n]:.2f}x")
    finally:
        _stop_pool(pipes, procs)


def sglang_checkpoint(models_dir, hidden: int):
    """A Llama of hidden size `hidden` (tests/sglang_support/tiny_model.py's config and tokenizer otherwise)."""
    import shutil
    from pathlib import Path

    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.sglang_support.tiny_model import CONFIGS, make_tiny_llama

    tiny = make_tiny_llama(Path(models_dir) / "llama")
    out = Path(models_dir) / f"llama-h{hidden}"
    if not (out / "config.json").is_file():
        heads = max(hidden // 64, 1)
        cfg = dict(CONFIGS["llama"], hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=heads,
                   num_key_value_heads=1, head_dim=hidden // heads)
        LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(out)
        for f in tiny.iterdir():
            if "token" in f.name:
                shutil.copy(f, out / f.name)
    return out


def sglang_senders(args) -> None:
    """Single vs per-stage senders into 1 and 2 real SGLang servers (module doc)."""
    from scalerl_mega.rollout.local import LocalModelSpec, build_model
    from tests.sglang_support.real_server import engine_for, launch

    counts = [int(x) for x in args.senders.split(",")]
    pipes, procs = _sender_pool(max(counts))
    try:
        for hidden in [int(x) for x in args.hiddens.split(",")]:
            path = sglang_checkpoint(args.models_dir, hidden)
            weights = [(n, t.contiguous()) for n, t in
                       build_model(LocalModelSpec(arch="llama", path=str(path)), device="cpu").state_dict().items()]
            nbytes = sum(t.numel() * t.element_size() for _, t in weights)
            for n_servers in [int(x) for x in args.sglang_servers.split(",")]:
                servers = []
                try:
                    servers = [launch(path, pause_mode="in_place") for _ in range(n_servers)]
                    engine = engine_for(*servers, pause_mode="in_place")
                    try:
                        med = _time_senders(engine, weights, counts=counts, pipes=pipes, repeats=args.repeats,
                                            tag=f"h{hidden}-sv{n_servers}")
                    finally:
                        engine.close()
                finally:
                    for srv in servers:
                        srv.stop()
                for n in counts:
                    print(f"hidden {hidden:4d} ({nbytes / 2**20:6.1f} MiB)  servers {n_servers}  senders {n}  median "
                          f"{med[n] * 1e3:8.1f} ms  vs {counts[0]} sender(s): {med[counts[0]] / med[n]:.2f}x  "
                          f"(model: 1.00x)")
    finally:
        _stop_pool(pipes, procs)


def main() -> None:
    import torch

    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine, build_model
    from scalerl_mega.weight_sync import DEFAULT_BUCKET_BYTES, WeightSyncConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--senders", default=None, help="e.g. 1,2,4: one vs many senders")
    ap.add_argument("--hiddens", default="128,256,512", help="model sizes for --senders")
    ap.add_argument("--sglang-servers", default=None, help="e.g. 1,2: into that many real SGLang servers (CPU)")
    ap.add_argument("--models-dir", default="build/sglang-models", help="where --sglang-servers' checkpoints go")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = dict(
        vocab_size=1024,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    if args.senders and args.sglang_servers:
        sglang_senders(args)
        return
    if args.senders:
        multi_sender(args, cfg)
        return
    spec = LocalModelSpec(arch="llama", config=cfg, init_seed=0)
    weights = list(build_model(spec, device="cpu").state_dict().items())
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    print(f"model: {len(weights)} tensors, {nbytes / 2**20:.1f} MiB (fp32)")
    sync = WeightSyncConfig(backend="gloo", timeout_s=120)
    engine = LocalRolloutEngine(LocalEngineConfig(model=spec, core=CoreConfig(max_batch=1, max_seq_len=16), sync=sync))
    results = {}
    try:
        version = 0
        for label, bucket_bytes, flattened in [
            ("per-tensor", 0, False),
            ("bucketed 512MiB", DEFAULT_BUCKET_BYTES, False),
            ("bucketed 512MiB flattened", DEFAULT_BUCKET_BYTES, True),
        ]:
            engine.config.sync.bucket_bytes = bucket_bytes
            engine.config.sync.flattened = flattened
            times = []
            for _ in range(args.repeats + 1):  # first run warms up (and forms the group)
                version += 1
                t0 = time.perf_counter()
                engine.update_weights(weights, version=version)
                times.append(time.perf_counter() - t0)
            med = statistics.median(times[1:])
            results[label] = med
            print(
                f"{label:28s} buckets={engine.last_sync_stats.buckets:4d}  median {med * 1e3:8.1f} ms  "
                f"({nbytes / med / 2**20:7.1f} MiB/s)"
            )
    finally:
        engine.close()
    base = results["per-tensor"]
    for label in ("bucketed 512MiB", "bucketed 512MiB flattened"):
        print(f"speedup {label} vs per-tensor: {base / results[label]:.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()
