"""Multi-sender weight sync at run time (who sends what: weight_sync/plan.py).

Every sender broadcasts its own planned buckets over its own named group (rank 0 of the group, the
engine's ranks after it; group setup as in weight_sync.py); an engine receives all groups at once,
one thread per group, stages what arrives and applies the update (and its version) only when every
group delivered every bucket. The controller announces all groups' buckets to the engines, after
checking the union of the senders' plans against the engine's manifest, before the first byte.

Deadlines: every broadcast wait on either side has `timeout_s`; a dead sender or engine makes the
other side's wait fail (gloo: connection closed) or time out, and the error names the sender (group),
bucket and its first tensor. A receiving engine joins each thread within the sum of its buckets'
deadlines, so nothing waits without bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from scalerl_mega.weight_sync import (BucketMeta, DistWeightReceiver, SendStats, TensorSpec, WeightSyncError,
                                      _wait_all, flatten_bucket, follow_plan, wire_tensors)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch.distributed import ProcessGroup


class MultiSyncEngine(Protocol):
    """The engine side a multi-sender push drives (`rollout.local.LocalRolloutEngine`)."""

    @property
    def group_world_size(self) -> int:
        """Ranks of each sender's group: the sender (rank 0) and every receiving engine rank."""
        ...

    def join_groups(self, init_methods: dict[str, str]) -> None: ...

    def wait_groups(self) -> None: ...

    def check_plan(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None: ...

    def announce_groups(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None: ...

    def finish_groups(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None: ...


def bucket_metas(buckets: list[list[TensorSpec]], *, version: int, flattened: bool,
                 seqs: list[int] | None = None) -> list[BucketMeta]:
    """What the engines are told about one sender's buckets (SGLang's request fields), each with its place in
    the receiving order (`seqs`, from `plan.receive_seqs`; default: the bucket's index)."""
    from scalerl_mega.weight_sync import FLATTENED_BUCKET

    seqs = list(range(len(buckets))) if seqs is None else seqs
    if len(seqs) != len(buckets):
        raise ValueError(f"weight sync: {len(seqs)} receive places for {len(buckets)} buckets")
    return [BucketMeta(names=[s.name for s in b], dtypes=[str(s.dtype) for s in b], shapes=[list(s.shape) for s in b],
                       version=version, index=i, load_format=FLATTENED_BUCKET if flattened else None, seq=q)
            for i, (b, q) in enumerate(zip(buckets, seqs))]


def receive_order(plan: dict[str, list[BucketMeta]]) -> list[tuple[str, BucketMeta]]:
    """Every group's buckets in the one order a receiver that takes one bucket at a time follows (an SGLang
    server; module doc of rollout/sglang/multi_groups.py): by `seq`, then bucket index, then group name. It is a
    function of the plan alone, so every server of an update takes the same sequence and no two servers can
    sit in different groups' broadcasts waiting on each other. A group's buckets keep their own order."""
    for group, metas in plan.items():
        seqs = [(m.seq, m.index) for m in metas]
        if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
            raise ValueError(f"weight sync: group {group!r}'s buckets are not in increasing receive order: {seqs}")
    return sorted(((g, m) for g, metas in plan.items() for m in metas), key=lambda gm: (gm[1].seq, gm[1].index, gm[0]))


def open_sender_group(group_name: str, init_method: str, *, world_size: int, backend: str, timeout_s: float) -> Any:
    """A sender's group, as its rank 0 (it hosts the group's store at `init_method`; the engines join at
    ranks 1..world_size-1). Under torchrun every TCP rendezvous would default to the elastic agent's
    store (TORCHELASTIC_USE_AGENT_STORE, see build.build_engine): the sender's groups are its own."""
    import os

    from scalerl_mega.weight_sync import init_custom_process_group

    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return init_custom_process_group(backend=backend, init_method=init_method, world_size=world_size, rank=0,
                                     group_name=group_name, timeout_s=timeout_s)


@dataclass
class SenderStats(SendStats):
    group: str = ""
    peak_bucket_bytes: int = 0


def send_buckets(group: "ProcessGroup", named_tensors: Iterable[tuple[str, "torch.Tensor"]], *,
                 buckets: list[list[TensorSpec]], group_name: str, version: int, timeout_s: float,
                 flattened: bool = False, before_bucket: Callable[[int], None] | None = None) -> SenderStats:
    """Broadcast this sender's stream (src 0 of `group`) in exactly the announced `buckets`.

    The stream must keep to the plan (names in order, shapes, dtypes): a deviation raises before that
    bucket's first byte. `before_bucket(i)` runs before bucket i is collected (a test hook)."""
    import torch.distributed as dist

    stats = SenderStats(version=version, group=group_name)
    t0 = time.perf_counter()
    stream = follow_plan(named_tensors, [s for b in buckets for s in b])
    flat = None
    for index, planned in enumerate(buckets):
        what = f"weight sync v{version} sender {group_name!r} bucket {index} (first tensor {planned[0].name!r})"
        if before_bucket is not None:
            before_bucket(index)
        tb = time.perf_counter()
        bucket: list[tuple[str, torch.Tensor]] = []
        for spec in planned:
            try:
                name, t = next(stream)
            except StopIteration:
                raise WeightSyncError(f"{what}: the stream ended before {spec.name!r}") from None
            if name != spec.name:
                raise WeightSyncError(f"{what}: the stream gave {name!r} where the plan has {spec.name!r}")
            bucket.append((name, t.detach().contiguous()))
        tensors = [t for _, t in bucket]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if flattened:
            flat = flatten_bucket(tensors, out=flat)
            tensors = [flat]
        try:
            works = [dist.broadcast(t, src=0, group=group, async_op=True) for t in wire_tensors(tensors, group)]
        except Exception as e:  # noqa: BLE001
            raise WeightSyncError(f"{what}: broadcast could not start: {e}") from e
        _wait_all(works, what=what, timeout_s=timeout_s)
        stats.buckets += 1
        stats.tensors += len(bucket)
        stats.bytes += nbytes
        stats.peak_bucket_bytes = max(stats.peak_bucket_bytes, nbytes * (2 if flattened else 1))
        stats.per_bucket_s.append(time.perf_counter() - tb)
        del bucket, tensors
    for name, _ in stream:  # pragma: no cover - follow_plan raises on extra tensors
        raise WeightSyncError(f"weight sync v{version} sender {group_name!r}: unplanned tensor {name!r}")
    stats.seconds = time.perf_counter() - t0
    return stats


@dataclass
class GroupFailure:
    group: str
    bucket: int
    tensor: str
    error: str

    def describe(self) -> str:
        return f"sender {self.group!r} bucket {self.bucket} (first tensor {self.tensor!r}): {self.error}"


@dataclass
class MultiReceive:
    """Result of one multi-group receive on an engine."""

    buckets: dict[str, int] = field(default_factory=dict)
    failures: list[GroupFailure] = field(default_factory=list)


def receive_groups(receivers: dict[str, DistWeightReceiver], plan: dict[str, list[BucketMeta]], *,
                   on_bucket: Callable[[str, BucketMeta, list[tuple[str, "torch.Tensor"]]], None]) -> MultiReceive:
    """Receive every group's announced buckets at once (one thread per group); `on_bucket` (serialised
    by a lock) stages each received bucket; it must copy tensors it keeps (flattened buckets are views
    of a reused buffer). Returns which groups failed where; every thread ends within its buckets'
    deadlines. A group of `plan` without a receiver fails at once."""
    lock = threading.Lock()
    res = MultiReceive()

    def run(group: str, metas: list[BucketMeta]) -> None:
        meta = None
        try:
            receiver = receivers.get(group)
            if receiver is None:
                raise WeightSyncError(f"this engine never joined group {group!r}")
            for meta in metas:
                received = receiver.receive_bucket(meta)
                with lock:
                    on_bucket(group, meta, received)
                    res.buckets[group] = res.buckets.get(group, 0) + 1
        except Exception as e:  # noqa: BLE001 - reported with the group, bucket and tensor
            with lock:
                res.failures.append(GroupFailure(group, meta.index if meta else 0,
                                                 meta.names[0] if meta and meta.names else "", f"{type(e).__name__}: {e}"))

    threads = [threading.Thread(target=run, args=(g, m), name=f"weights-{g}", daemon=True) for g, m in plan.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return res


def plan_specs(plan: dict[str, list[BucketMeta]]) -> list[TensorSpec]:
    """Every tensor of a multi-sender update, for the manifest check."""
    return [TensorSpec(n, tuple(s), d) for metas in plan.values() for m in metas
            for n, d, s in zip(m.names, m.dtypes, m.shapes)]


def single_sender_metrics(stats: SendStats | None, *, seconds: float) -> dict[str, float]:
    """The `sync/*` fields of a one-sender push (`DistWeightSender`'s stats; rank 0 holds every bucket, so
    its transient sync memory is at least its largest bucket)."""
    if stats is None:
        return {"sync/seconds": float(seconds)}
    return {"sync/senders": 1.0, "sync/bytes": float(stats.bytes), "sync/max_sender_bytes": float(stats.bytes),
            "sync/seconds": float(seconds)}


def sync_metrics(per_sender: list[dict[str, int | str]], *, seconds: float) -> dict[str, float]:
    """The train record's `sync/*` fields from every sender's stats (`SenderStats` as dicts) and
    every rank's transient bytes (`transient_bytes`, 0 on ranks that only gathered)."""
    senders = [s for s in per_sender if s.get("group")]
    return {
        "sync/senders": float(len(senders)),
        "sync/bytes": float(sum(s["bytes"] for s in senders)),
        "sync/max_sender_bytes": float(max((s["bytes"] for s in senders), default=0)),
        "sync/seconds": float(seconds),
        "sync/max_rank_transient_bytes": float(max((s.get("transient_bytes", 0) for s in per_sender), default=0)),
    }

