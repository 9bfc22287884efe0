#!/usr/bin/env python
"""Benchmark: HF <-> Megatron conversion throughput and peak memory on a ~1B-parameter random
dense Llama generated on the fly (streamed to disk, never held in memory).

Prints tensors/s, GB/s and each direction's peak RSS (measured per child process with wait4),
relative to the largest input shard (target: < 1.5x) and to a baseline child that only imports
the converter (same run).

    python bench/convert.py [--layers 14 --hidden 2048 --ffn 8192 --vocab 32000 --shard-gb 1 --tp 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def generate(path: str, *, layers: int, hidden: int, ffn: int, vocab: int, heads: int, kv: int, shard_bytes: int) -> int:
    """Write a random bf16 Llama checkpoint tensor by tensor; returns the parameter count."""
    import torch

    from scalerl_mega.convert import tables
    from scalerl_mega.convert.dims import dims_from_hf_config
    from scalerl_mega.convert.st_io import ShardedWriter

    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": ffn,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
           "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": False, "hidden_act": "silu",
           "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "dtype": "bfloat16"}
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    dims = dims_from_hf_config(cfg)
    w = ShardedWriter(path, max_shard_bytes=shard_bytes)
    n = 0
    g = torch.Generator().manual_seed(0)
    for name in tables.hf_names(dims):
        shape = tables.expected_hf_shape(name, dims)
        t = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
        n += t.numel()
        w.add(name, t)
        del t
    w.finish()
    return n


_HWM = (";import re;print('VmHWM', re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))")


def run_child(code: str) -> tuple[float, int, str]:
    """Run python code in a fresh child; return (seconds, peak RSS bytes, stdout). The peak is the
    child's own VmHWM (ru_maxrss would include the parent's RSS inherited through fork+exec)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + _HWM], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    if proc.returncode:
        raise SystemExit(f"child failed ({proc.returncode}): {code}\n{proc.stderr[-2000:]}")
    lines = proc.stdout.split("\n")
    hwm = int([ln for ln in lines if ln.startswith("VmHWM")][-1].split()[1]) * 1024
    out = "\n".join(ln for ln in lines if not ln.startswith("VmHWM"))
    return time.perf_counter() - t0, hwm, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=14)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv", type=int, default=8)
    ap.add_argument("--shard-gb", type=float, default=1.0)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_convert_", dir=args.workdir)
    try:
        hf, mc, back = (os.path.join(work, d) for d in ("hf", "mc", "back"))
        t0 = time.perf_counter()
        n = generate(hf, layers=args.layers, hidden=args.hidden, ffn=args.ffn, vocab=args.vocab, heads=args.heads, kv=args.kv,
                     shard_bytes=int(args.shard_gb * (1 << 30)))
        gen_s = time.perf_counter() - t0
        shards = [os.path.getsize(os.path.join(hf, f)) for f in os.listdir(hf) if f.endswith(".safetensors")]
        largest, total = max(shards), sum(shards)
        _, base_rss, _ = run_child("import torch, scalerl_mega.convert.pipeline")
        t_fwd, rss_fwd, out_fwd = run_child(
            "from scalerl_mega.convert.pipeline import convert_hf_to_megatron as c;"
            f"s=c(hf_dir={hf!r}, out={mc!r}, tp={args.tp}); print(s.tensors)")
        t_bwd, rss_bwd, out_bwd = run_child(
            "from scalerl_mega.convert.to_hf import convert_megatron_to_hf as c;"
            f"s=c(ckpt={mc!r}, out={back!r}, max_shard_bytes={int(args.shard_gb * (1 << 30))}); print(s.tensors)")
        gb = total / 1e9
        print(f"model: {n / 1e9:.3f}B params bf16, {gb:.2f} GB in {len(shards)} shards, largest shard {largest / 1e9:.3f} GB (generated in {gen_s:.1f} s)")
        print(f"baseline child RSS (imports only): {base_rss / 1e9:.3f} GB")
        for label, secs, rss, count in (("hf->megatron (tp=%d)" % args.tp, t_fwd, rss_fwd, int(out_fwd.split()[-1])),
                                         ("megatron->hf", t_bwd, rss_bwd, int(out_bwd.split()[-1]))):
            print(f"{label}: {count} tensors in {secs:.1f} s = {count / secs:.1f} tensors/s, {gb / secs:.2f} GB/s; "
                  f"peak RSS {rss / 1e9:.3f} GB = {rss / largest:.2f}x largest shard (target < 1.5x), "
                  f"{(rss - base_rss) / 1e9:.3f} GB above baseline = {(rss - base_rss) / total:.3f}x model size")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
