"""Bucketed broadcast of HF-named weights from the trainer (rank 0) to rollout engines.

Group setup mirrors SGLang 0.5.23's `init_custom_process_group` (its trainer-side NCCL group):
`rendezvous(tcp://addr:port)` -> `PrefixStore(group_name, store)` -> torch's internal
`_new_process_group_helper` -> identity entry in `_world.pg_group_ranks`. A plain
`init_process_group` uses a different store prefix and would hang against SGLang; it would also
clobber the trainer's own WORLD group. Trainer = rank 0; engine i joins at
`rank_offset = 1 + sum(GPUs of engines before i)` (+ its TP rank).

Per bucket (SGLang's `update_weights_from_distributed` contract): the receiver is told the names,
dtypes and shapes first (HTTP body, or a pipe message for the local engine), then rank 0
broadcasts each tensor in exactly that order (async), and both sides wait. With
`flattened=True` a bucket travels as one uint8 tensor (`load_format="flattened_bucket"`).

Every wait has a deadline; failures raise `WeightSyncError` naming the bucket, tensor and peer
(the anchors' most common bug is a silent hang).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch.distributed import ProcessGroup, Work

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 512 << 20
FLATTENED_BUCKET = "flattened_bucket"


class WeightSyncError(RuntimeError):
    """A weight sync step failed or timed out; the engine's weights may be partially updated
    (except for a rejection by the manifest check, which happens before anything is sent)."""


@dataclass(kw_only=True)
class WeightSyncConfig:
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Bytes per bucket; <= 0 sends one tensor per bucket (the per-tensor baseline)."""
    timeout_s: float = 120.0
    """Deadline of every step: group init, each broadcast, each acknowledgement."""
    flattened: bool = False
    """Send each bucket as one uint8 tensor (SGLang load_format="flattened_bucket")."""
    group_name: str = "weight_update_group"
    backend: str = "gloo"
    """"gloo" on CPU, "nccl" on GPU."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"WeightSyncConfig.timeout_s={self.timeout_s} must be > 0")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"WeightSyncConfig.backend={self.backend!r} must be 'gloo' or 'nccl'")


@dataclass(kw_only=True)
class BucketMeta:
    """What the receiver needs before a bucket's broadcast (SGLang request fields)."""

    names: list[str]
    dtypes: list[str]
    """torch dtype names without the "torch." prefix ("float32", "bfloat16"), as SGLang expects."""
    shapes: list[list[int]]
    version: int
    index: int = 0
    load_format: str | None = None
    """None (one broadcast per tensor) or "flattened_bucket" (one uint8 broadcast)."""
    seq: int = 0
    """Place in a multi-sender update's one receiving order (`multi.receive_order`; `plan.receive_seqs`); not
    sent to the engine."""

    @property
    def num_bytes(self) -> int:
        return sum(_numel(s) * _itemsize(d) for s, d in zip(self.shapes, self.dtypes))


@dataclass
class SendStats:
    version: int
    buckets: int = 0
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    per_bucket_s: list[float] = field(default_factory=list)


def dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).replace("torch.", "")


def dtype_from_name(name: str) -> "torch.dtype":
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r} in weight-sync metadata")
    return dt


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _itemsize(dtype: str) -> int:
    return dtype_from_name(dtype).itemsize


def weights_sha256(named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> str:
    """SHA-256 over (name, dtype, shape, raw bytes) of every tensor, in name order: a fingerprint
    that two holders of the same weights (an engine after a sync, a converted checkpoint) share
    bit for bit."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda nt: nt[0]):
        t = t.detach().contiguous()
        h.update(f"{name}|{dtype_name(t.dtype)}|{list(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


# ---- manifest: what the generator accepts, checked before the first bucket ---------------------
@dataclass(frozen=True)
class TensorSpec:
    """One tensor of an update (or of a generator's model): HF name, shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str | None = None
    """torch dtype name; None = any (the receiver casts on load, as SGLang and the local engine do)."""

    def describe(self) -> str:
        return f"{self.dtype or ''}{list(self.shape)}"


class WeightManifest:
    """The tensors a generator's model holds: HF name -> TensorSpec; `aliases` maps a tied name to the
    name it shares storage with (`lm_head.weight` -> `model.embed_tokens.weight` under tied embeddings).

    `problems(plan)` compares a whole update with it before anything is sent: every tensor must be a
    parameter (or an alias) with the model's shape (and dtype, where the manifest fixes one), and the
    update must cover every parameter (a full weight push; a parameter left out would silently keep
    its old value). SGLang applies each bucket as it arrives, so this check is what keeps a wrong name
    or shape from leaving a generator half-updated.
    """

    def __init__(self, specs: Iterable[TensorSpec], *, aliases: dict[str, str] | None = None, source: str) -> None:
        self.specs = {s.name: s for s in specs}
        self.aliases = dict(aliases or {})
        self.source = source

    @classmethod
    def of_module(cls, model: "torch.nn.Module", *, source: str) -> "WeightManifest":
        """From a torch module's parameters (a meta-device model is enough); tied parameters become
        aliases of the first name they appear under."""
        first: dict[int, str] = {}
        specs, aliases = [], {}
        for name, p in model.named_parameters(remove_duplicate=False):
            owner = first.setdefault(id(p), name)
            if owner == name:
                specs.append(TensorSpec(name, tuple(p.shape)))
            else:
                aliases[name] = owner
        return cls(specs, aliases=aliases, source=source)

    def problems(self, plan: Iterable[TensorSpec]) -> list[str]:
        import difflib

        out: list[str] = []
        covered: set[str] = set()
        for s in plan:
            key = self.aliases.get(s.name, s.name)
            exp = self.specs.get(key)
            if exp is None:
                near = difflib.get_close_matches(s.name, list(self.specs) + list(self.aliases), n=1)
                out.append(f"{s.name!r} is not a parameter of the generator's model"
                           + (f" (closest: {near[0]!r})" if near else ""))
                continue
            covered.add(key)
            if tuple(s.shape) != exp.shape or (exp.dtype is not None and s.dtype != exp.dtype):
                out.append(f"{s.name!r}: the update has {s.describe()}, the generator expects {exp.describe()}")
        missing = [n for n in self.specs if n not in covered]
        if missing:
            out.append(f"{len(missing)} parameter(s) of the generator's model are not in the update and would keep "
                       f"their old weights: {', '.join(repr(n) for n in missing[:5])}{', ...' if len(missing) > 5 else ''}")
        return out

    def check(self, plan: Iterable[TensorSpec], *, version: int) -> None:
        """Raise WeightSyncError naming every offending tensor (first 8) if `plan` does not fit."""
        problems = self.problems(plan)
        if problems:
            more = f"; and {len(problems) - 8} more" if len(problems) > 8 else ""
            raise WeightSyncError(
                f"weight update v{version} rejected before the first bucket was sent, nothing was applied (the "
                f"generator keeps serving its previous weights): {'; '.join(problems[:8])}{more} "
                f"[manifest: {self.source}]"
            )


class PlannedTensors:
    """`(name, tensor)` pairs that announce their names, shapes and dtypes up front (`plan`), so a
    generator's manifest is checked before the first tensor is produced (the trainer's lazy export:
    its tensors are gathered one group at a time and never all resident). Single use, like the
    iterator it wraps; `follow_plan` checks that the stream keeps to its plan."""

    def __init__(self, source: Iterable[tuple[str, "torch.Tensor"]], *, plan: list[TensorSpec]) -> None:
        self.source = source
        self.plan = plan

    def __iter__(self) -> Iterator[tuple[str, "torch.Tensor"]]:
        return iter(self.source)


def spec_of(name: str, t: "torch.Tensor") -> TensorSpec:
    return TensorSpec(name, tuple(t.shape), dtype_name(t.dtype))


def follow_plan(named_tensors: Iterable[tuple[str, "torch.Tensor"]], plan: list[TensorSpec]
                ) -> Iterator[tuple[str, "torch.Tensor"]]:
    """Yield `named_tensors`, raising WeightSyncError as soon as one differs from `plan` (unplanned
    name, other shape or dtype, repeated) or, at the end, when planned ones never came. Order-free:
    a pipeline-parallel export yields stage by stage."""
    want = {s.name: s for s in plan}
    seen: set[str] = set()
    for name, t in named_tensors:
        s = want.get(name)
        got = spec_of(name, t)
        if s is None or name in seen or got.shape != tuple(s.shape) or (s.dtype is not None and got.dtype != s.dtype):
            why = ("is not in the plan" if s is None else "came twice" if name in seen
                   else f"is {got.describe()}, the plan said {s.describe()}")
            raise WeightSyncError(f"weight stream left its announced plan: {name!r} {why}")
        seen.add(name)
        yield name, t
    if len(seen) != len(want):
        left = [n for n in want if n not in seen]
        raise WeightSyncError(f"weight stream ended without {len(left)} planned tensor(s), e.g. {left[0]!r}")


def checked_update(named_tensors: Iterable[tuple[str, "torch.Tensor"]], manifest: WeightManifest | None, *,
                   version: int) -> Iterable[tuple[str, "torch.Tensor"]]:
    """Check a whole update against `manifest` before anything is sent; return what to send.

    A `PlannedTensors` is checked by its plan and streamed (`follow_plan` guards the stream); any
    other iterable is first collected into a list (its tensors exist already, or are produced now),
    so every tensor is checked before the first bucket. `manifest=None`: no check (the receivers
    still reject a wrong tensor when it arrives, which SGLang does after applying earlier buckets).
    """
    if manifest is None:
        return named_tensors
    plan = getattr(named_tensors, "plan", None)
    if plan is None:
        named_tensors = list(named_tensors)
        plan = [spec_of(n, t) for n, t in named_tensors]
    manifest.check(plan, version=version)
    return follow_plan(named_tensors, plan)


# ---- group setup --------------------------------------------------------------------------------
def init_custom_process_group(
    *,
    backend: str,
    init_method: str,
    world_size: int,
    rank: int,
    group_name: str,
    timeout_s: float,
) -> Any:
    """Create a process group the way SGLang's engine does (module doc); returns the group.

    Blocks until all `world_size` ranks join (rank 0 hosts the TCP store); raises
    WeightSyncError after `timeout_s`.
    """
    from torch.distributed import distributed_c10d as c10d

    timeout = timedelta(seconds=timeout_s)
    try:
        store, rank, world_size = next(c10d.rendezvous(init_method, rank, world_size, timeout=timeout))
        store.set_timeout(timeout)
        store = c10d.PrefixStore(group_name, store)
        pg, _ = c10d._new_process_group_helper(
            world_size,
            rank,
            [],
            c10d.Backend(backend),
            store,
            group_name=group_name,
            backend_options=None,
            timeout=timeout,
        )
    except Exception as e:  # noqa: BLE001 - re-raised with context
        raise WeightSyncError(
            f"weight-sync group {group_name!r} ({backend}, {init_method}, rank {rank}/{world_size}) "
            f"failed to form within {timeout_s}s: {e}"
        ) from e
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def destroy_group(group: "ProcessGroup") -> None:
    import torch.distributed as dist

    try:
        dist.destroy_process_group(group)
    except (RuntimeError, ValueError) as exc:  # already destroyed or never formed: nothing left to free
        log.warning("weight sync: destroying the process group failed (%s)", exc)


def engine_rank_offsets(gpus_per_engine: list[int]) -> tuple[int, list[int]]:
    """(world_size, rank_offset per engine): trainer is rank 0, engine i starts after the GPUs
    of engines before it (slime's connect_rollout_engines_from_distributed)."""
    if any(g < 1 for g in gpus_per_engine):
        raise ValueError(f"gpus_per_engine={gpus_per_engine}: every engine needs >= 1 rank")
    offsets, acc = [], 1
    for g in gpus_per_engine:
        offsets.append(acc)
        acc += g
    return acc, offsets


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- buckets ------------------------------------------------------------------------------------
def iter_buckets(
    named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, bucket_bytes: int
) -> Iterator[list[tuple[str, "torch.Tensor"]]]:
    """Group tensors in order into buckets of at most `bucket_bytes` (a larger tensor travels
    alone); `bucket_bytes <= 0` gives one tensor per bucket. Lazy: holds one bucket at a time."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and (bucket_bytes <= 0 or size + nbytes > bucket_bytes):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def flatten_bucket(tensors: list["torch.Tensor"], *, out: "torch.Tensor | None" = None) -> "torch.Tensor":
    """Concatenate the raw bytes of `tensors` (in order) into one uint8 tensor (into the front of
    `out` when it is large enough: a reused buffer avoids page-faulting a fresh one per bucket)."""
    import torch

    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    n = sum(p.numel() for p in parts)
    if out is None or out.numel() < n or out.device != (parts[0].device if parts else out.device):
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
    return torch.cat(parts, out=out[:n])


def unflatten_bucket(flat: "torch.Tensor", meta: BucketMeta) -> list[tuple[str, "torch.Tensor"]]:
    """Inverse of `flatten_bucket` given the bucket's names, dtypes and shapes."""
    out, off = [], 0
    for name, dt, shape in zip(meta.names, meta.dtypes, meta.shapes):
        dtype = dtype_from_name(dt)
        n = _numel(shape) * dtype.itemsize
        raw = flat[off : off + n]
        if off % dtype.itemsize:  # a view needs an aligned offset: copy the misaligned slice
            raw = raw.clone()
        out.append((name, raw.view(dtype).reshape(shape)))
        off += n
    if off != flat.numel():
        raise WeightSyncError(f"bucket {meta.index}: flattened size {flat.numel()} != metadata total {off}")
    return out


def bucket_meta(bucket: list[tuple[str, "torch.Tensor"]], *, version: int, index: int, flattened: bool) -> BucketMeta:
    return BucketMeta(
        names=[n for n, _ in bucket],
        dtypes=[dtype_name(t.dtype) for _, t in bucket],
        shapes=[list(t.shape) for _, t in bucket],
        version=version,
        index=index,
        load_format=FLATTENED_BUCKET if flattened else None,
    )


# ---- broadcast with deadlines -----------------------------------------------------------------
def wire_tensors(tensors: list["torch.Tensor"], group: "ProcessGroup") -> list["torch.Tensor"]:
    """`tensors` as they cross `group`: on gloo, which has no float8 type, a float8 tensor (an FP8 weight push,
    quant/fp8.py) travels as a uint8 view of its bytes (same storage: received bytes land in the float8 buffer);
    on NCCL, and any other dtype, unchanged."""
    import torch
    import torch.distributed as dist

    if not any(t.is_floating_point() and t.element_size() == 1 for t in tensors) or dist.get_backend(group) != "gloo":
        return tensors
    return [t.view(torch.uint8) if t.is_floating_point() and t.element_size() == 1 else t for t in tensors]


def _wait_all(works: list[Work], *, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for i, w in enumerate(works):
        left = max(deadline - time.monotonic(), 0.001)
        try:
            ok = w.wait(timeout=timedelta(seconds=left))
        except Exception as e:  # noqa: BLE001 - re-raised with context
            raise WeightSyncError(f"{what}: broadcast {i + 1}/{len(works)} failed: {e}") from e
        if ok is False:
            raise WeightSyncError(f"{what}: broadcast {i + 1}/{len(works)} did not finish within {timeout_s}s")


Waiter = Callable[[float], None]
"""Waits (up to the given seconds) for a receiver's acknowledgement; raises on failure."""


class BucketAnnouncer(Protocol):
    """Control channel to the receivers (HTTP for SGLang, a pipe for the local engine)."""

    def begin(self, version: int) -> None: ...

    def announce(self, meta: BucketMeta) -> Waiter:
        """Tell every receiver about the next bucket (without waiting); return a waiter."""

    def end(self, version: int) -> None: ...

    def abort(self, version: int) -> None:
        """The source of the tensors failed between two buckets: receivers that stage the update
        discard it (the local engine); SGLang has applied the earlier buckets already."""


class DistWeightSender:
    """Rank-0 side: `send(named_tensors, version)` streams buckets to all engines in `group`."""

    def __init__(self, group: "ProcessGroup", *, announcer: BucketAnnouncer, config: WeightSyncConfig) -> None:
        self.group = group
        self.announcer = announcer
        self.config = config
        self._flat: torch.Tensor | None = None

    def send(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, version: int) -> SendStats:
        import torch.distributed as dist

        cfg = self.config
        stats = SendStats(version=version)
        t0 = time.perf_counter()
        self.announcer.begin(version)
        buckets = iter_buckets(named_tensors, bucket_bytes=cfg.bucket_bytes)
        for index in itertools.count():
            try:
                bucket = next(buckets)
            except StopIteration:
                break
            except BaseException:  # the source failed (e.g. it left its plan) between two buckets
                abort = getattr(self.announcer, "abort", None)
                if abort is not None:
                    abort(version)
                raise
            tb = time.perf_counter()
            meta = bucket_meta(bucket, version=version, index=index, flattened=cfg.flattened)
            waiter = self.announcer.announce(meta)
            tensors = [t.detach().contiguous() for _, t in bucket]
            if cfg.flattened:
                flat = flatten_bucket(tensors, out=self._flat)
                if self._flat is None or flat.data_ptr() != self._flat.data_ptr():
                    self._flat = flat  # keep the largest buffer for the next buckets
                tensors = [flat]
            what = f"weight sync v{version} bucket {index} ({len(bucket)} tensors, first {meta.names[0]!r})"
            try:
                works = [dist.broadcast(t, src=0, group=self.group, async_op=True) for t in wire_tensors(tensors, self.group)]
            except Exception as e:  # noqa: BLE001
                raise WeightSyncError(f"{what}: broadcast could not start: {e}") from e
            _wait_all(works, what=what, timeout_s=cfg.timeout_s)
            waiter(cfg.timeout_s)
            stats.buckets += 1
            stats.tensors += len(bucket)
            stats.bytes += meta.num_bytes
            stats.per_bucket_s.append(time.perf_counter() - tb)
        self.announcer.end(version)
        stats.seconds = time.perf_counter() - t0
        return stats


class DistWeightReceiver:
    """Engine side: receives one announced bucket (allocates per metadata, broadcast from rank 0).

    Flattened buckets land in a reused buffer: the returned tensors are views into it and are valid
    only until the next `receive_bucket` (load them into the model right away, as the engines do).
    """

    def __init__(self, group: "ProcessGroup", *, timeout_s: float, device: "str | torch.device" = "cpu") -> None:
        self.group = group
        self.timeout_s = timeout_s
        self.device = device
        self._flat: torch.Tensor | None = None

    def receive_bucket(self, meta: BucketMeta) -> list[tuple[str, "torch.Tensor"]]:
        import torch
        import torch.distributed as dist

        if not (len(meta.names) == len(meta.dtypes) == len(meta.shapes)):
            raise WeightSyncError(
                f"bucket {meta.index}: names/dtypes/shapes lengths differ "
                f"({len(meta.names)}/{len(meta.dtypes)}/{len(meta.shapes)})"
            )
        what = f"weight receive v{meta.version} bucket {meta.index}"
        if meta.load_format == FLATTENED_BUCKET:
            n = meta.num_bytes
            if self._flat is None or self._flat.numel() < n:
                self._flat = torch.empty(n, dtype=torch.uint8, device=self.device)
            flat = self._flat[:n]  # reused: the caller copies the unflattened views into the model
            works = [dist.broadcast(flat, src=0, group=self.group, async_op=True)]
            _wait_all(works, what=what, timeout_s=self.timeout_s)
            return unflatten_bucket(flat, meta)
        if meta.load_format is not None:
            raise WeightSyncError(f"{what}: unsupported load_format {meta.load_format!r}")
        out = [
            (n, torch.empty(s, dtype=dtype_from_name(d), device=self.device))
            for n, d, s in zip(meta.names, meta.dtypes, meta.shapes)
        ]
        works = [dist.broadcast(t, src=0, group=self.group, async_op=True)
                 for t in wire_tensors([t for _, t in out], self.group)]
        _wait_all(works, what=what, timeout_s=self.timeout_s)
        return out
