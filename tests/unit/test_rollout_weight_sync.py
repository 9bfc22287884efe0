"""Weight-sync helpers: bucketing, flattened-bucket format, rank layout, config validation."""

from __future__ import annotations

import pytest
import torch

from scalerl_mega.weight_sync import (
    FLATTENED_BUCKET,
    WeightSyncConfig,
    bucket_meta,
    engine_rank_offsets,
    flatten_bucket,
    iter_buckets,
    unflatten_bucket,
)


def _t(n, dtype=torch.float32):
    return torch.arange(n, dtype=torch.float32).to(dtype)


def test_iter_buckets_groups_in_order_by_bytes():
    named = [("a", _t(10)), ("b", _t(10)), ("c", _t(30)), ("d", _t(5)), ("e", _t(5))]  # 40, 40, 120, 20, 20 bytes
    got = [[n for n, _ in b] for b in iter_buckets(named, bucket_bytes=100)]
    # a+b = 80; c alone (120 > 100 travels alone); d+e = 40
    assert got == [["a", "b"], ["c"], ["d", "e"]]
    assert [[n for n, _ in b] for b in iter_buckets(named, bucket_bytes=0)] == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert list(iter_buckets([], bucket_bytes=10)) == []


def test_flattened_bucket_roundtrip_mixed_dtypes():
    bucket = [
        ("w", torch.randn(3, 4)),
        ("b", torch.randn(5).to(torch.bfloat16)),
        ("i", torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)),
    ]
    meta = bucket_meta(bucket, version=7, index=2, flattened=True)
    assert meta.load_format == FLATTENED_BUCKET and meta.dtypes == ["float32", "bfloat16", "int64"]
    assert meta.num_bytes == 12 * 4 + 5 * 2 + 4 * 8
    flat = flatten_bucket([t for _, t in bucket])
    assert flat.dtype == torch.uint8 and flat.numel() == meta.num_bytes
    for (n0, t0), (n1, t1) in zip(bucket, unflatten_bucket(flat, meta)):
        assert n0 == n1 and t0.dtype == t1.dtype and torch.equal(t0, t1)


def test_engine_rank_offsets_follow_slime_layout():
    # trainer rank 0; engines with 2, 1, 4 GPUs start at 1, 3, 4; world = 1 + 7
    assert engine_rank_offsets([2, 1, 4]) == (8, [1, 3, 4])
    with pytest.raises(ValueError):
        engine_rank_offsets([1, 0])


def test_config_validation_names_the_key():
    with pytest.raises(ValueError, match="timeout_s"):
        WeightSyncConfig(timeout_s=0)
    with pytest.raises(ValueError, match="backend"):
        WeightSyncConfig(backend="mpi")
