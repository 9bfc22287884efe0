"""Weight sync trainer process -> local engine process over gloo: per-tensor vs bucketed.

Per-tensor = one announce + broadcast + acknowledgement per tensor (one SGLang
/update_weights_from_distributed call per tensor). Bucketed = 512 MiB buckets (default), with
per-tensor broadcasts inside a bucket or one flattened uint8 tensor. Target: bucketed >= 3x faster
for a model with >= 100 tensors. Prints medians of `--repeats` syncs and the ratios.

    .venv/bin/python bench/weight_sync.py [--layers 12] [--hidden 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import torch

    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine, build_model
    from scalerl_mega.weight_sync import DEFAULT_BUCKET_BYTES, WeightSyncConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
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
