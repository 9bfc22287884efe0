"""Who sends which weights in a multi-sender weight sync: pure planning, no I/O, no torch.distributed.

One sender per pipeline stage: the stage's emitting rank (tensor-, data- and context-parallel rank 0)
gathers only its stage's layers (the embedding with the first stage, the final norm and LM head with
the last) and broadcasts them over its own named group (`<base>-pp<s>`). With expert parallelism each
stage also has expert senders: an expert-parallel rank (after the expert-TP gather) sends the experts
it owns over `<base>-pp<s>-ep<k>`, so no rank holds all of a layer's experts; the stage's
emitting rank is expert-parallel rank 0 and sends pool 0's experts with the dense weights.

Groups per engine: `pp * k`, `k` = expert senders per stage = the largest divisor of `ep` with
`pp * k <= max_groups` (every engine joins every group: one communicator each). With `ep / k > 1`
consecutive expert-parallel ranks form a pool whose first rank gathers and sends the pool's experts.
`pp > max_groups` is refused (a stage's weights live on that stage only). Experts stored fused in one
HF tensor per layer (Llama-4's `experts.gate_up_proj`) are one tensor: they go with the stage's dense
sender, gathered over the expert-parallel group as in the single-sender export; their pools carry
nothing and get no group (`sender_specs` drops empty senders), so such a model has one sender per stage.

A sender's buckets are a pure function of its planned tensors (`plan_buckets`), so the controller can
announce every group's buckets to the engines, and check the whole update against the engine's
manifest, before the first byte moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.convert.dims import ArchDims
    from scalerl_mega.convert.tables import Group
    from scalerl_mega.weight_sync import TensorSpec

DEFAULT_MAX_GROUPS = 16
"""Default cap on weight-update groups per engine (one NCCL communicator each on the engine's GPUs)."""


@dataclass(frozen=True)
class Sender:
    stage: int
    pool: int
    """0: the stage's emitting rank (dense weights, fused experts, pool 0's experts); k > 0: expert pool k."""
    group_name: str

    @property
    def label(self) -> str:
        return f"sender pp{self.stage}" + (f" ep-pool {self.pool}" if self.pool else " (stage leader)")


def expert_senders_per_stage(*, pp: int, ep: int, max_groups: int = DEFAULT_MAX_GROUPS) -> int:
    """k: the largest divisor of `ep` with `pp * k <= max_groups` (module doc)."""
    for name, v in (("pp", pp), ("ep", ep), ("max_groups", max_groups)):
        if v < 1:
            raise ValueError(f"weight sync: {name}={v} must be >= 1")
    if pp > max_groups:
        raise ValueError(f"weight sync: max_groups={max_groups} (groups per engine) is smaller than the {pp} pipeline "
                         "stages; every stage sends over its own group, so raise it to at least pp")
    cap = max_groups // pp
    return max(d for d in range(1, ep + 1) if ep % d == 0 and d <= cap)


@dataclass(frozen=True)
class SenderLayout:
    pp: int = 1
    ep: int = 1
    max_groups: int = DEFAULT_MAX_GROUPS
    base_name: str = "weight_update_group"

    @property
    def pools(self) -> int:
        return expert_senders_per_stage(pp=self.pp, ep=self.ep, max_groups=self.max_groups)

    @property
    def pool_size(self) -> int:
        """Expert-parallel ranks per expert pool."""
        return self.ep // self.pools

    @property
    def senders(self) -> list[Sender]:
        return [self.sender(s, k) for s in range(self.pp) for k in range(self.pools)]

    def sender(self, stage: int, pool: int) -> Sender:
        name = f"{self.base_name}-pp{stage}" + (f"-ep{pool}" if pool else "")
        return Sender(stage=stage, pool=pool, group_name=name)

    def pool_of(self, ep_rank: int) -> int:
        return ep_rank // self.pool_size

    def sends(self, *, stage: int, ep_rank: int, emitting: bool, expert_emitting: bool) -> list[Sender]:
        """The groups a trainer rank sends over: its stage leader's group when it is the stage's
        emitting rank; its expert pool's group when it is that pool's first expert-parallel rank
        (and expert tensor-/data-parallel rank 0) and the pool is not pool 0."""
        out = [self.sender(stage, 0)] if emitting else []
        pool = self.pool_of(ep_rank)
        if expert_emitting and pool > 0 and ep_rank % self.pool_size == 0:
            out.append(self.sender(stage, pool))
        return out


def _stage_groups(dims: "ArchDims", layout: SenderLayout) -> Iterable[tuple[int, "Group"]]:
    """(stage, conversion-table group) in the order every rank of a stage exports them: stage after stage, each
    stage's layers split evenly (`sharding.stage_layers`), its groups in table order."""
    from scalerl_mega.convert import sharding, tables

    for stage in range(layout.pp):
        yield from ((stage, g) for g in tables.iter_groups(
            dims, layers=sharding.stage_layers(dims.num_layers, pp=layout.pp, stage=stage),
            first_stage=stage == 0, last_stage=stage == layout.pp - 1))


def sender_specs(dims: "ArchDims", layout: SenderLayout, plan: Iterable["TensorSpec"]) -> dict[str, list["TensorSpec"]]:
    """Group name -> the planned tensors (`export.export_plan`) its sender sends, each sender's in
    table order: layers split evenly over the stages (`sharding.stage_layers`), a per-expert
    tensor to the pool of the expert-parallel rank owning it (`sharding.expert_owner`)."""
    from scalerl_mega.convert import sharding

    by_name = {s.name: s for s in plan}
    out: dict[str, list] = {s.group_name: [] for s in layout.senders}
    for stage, g in _stage_groups(dims, layout):
        pool = 0
        if g.rule.per_expert:
            e = sharding.expert_index(g.mcore[0])
            pool = layout.pool_of(sharding.expert_owner(e, num_experts=dims.num_experts, ep=layout.ep))
        out[layout.sender(stage, pool).group_name] += [by_name[n] for n in g.hf]
    placed = sum(len(v) for v in out.values())
    if placed != len(by_name):
        raise ValueError(f"weight sync: the senders' plans hold {placed} tensors, the export plan {len(by_name)}")
    return {g: v for g, v in out.items() if v}  # fused experts leave expert pools empty: no group for them


def receive_seqs(dims: "ArchDims", layout: SenderLayout,
                 buckets: dict[str, list[list["TensorSpec"]]]) -> dict[str, list[int]]:
    """Each bucket's place in the update's one receiving order (`BucketMeta.seq`): the export position of its
    last tensor (stage after stage, table order within a stage).

    Why: a receiver that takes one bucket at a time (an SGLang server) must take them in an order every
    server shares (two servers inside different groups' broadcasts wait on each other), and in an order the
    senders can reach: the ranks of a stage gather every table group together (collectives), and a sender
    broadcasts a bucket right after the gather of its last tensor, so the bucket whose last tensor comes first
    is always the next one its sender can send while every other sender of the stage still takes part in the
    gathers. Stages gather independently, so taking the stages one after another is safe too."""
    pos: dict[str, int] = {}
    for _, g in _stage_groups(dims, layout):
        for n in g.hf:
            pos.setdefault(n, len(pos))
    out = {}
    for group, bs in buckets.items():
        missing = [b[-1].name for b in bs if b[-1].name not in pos]
        if missing:
            raise ValueError(f"weight sync: group {group!r} plans {missing[0]!r}, which no stage exports")
        out[group] = [pos[b[-1].name] for b in bs]
    return out


def spec_bytes(spec: "TensorSpec") -> int:
    """Bytes of a planned tensor; its dtype must be resolved (a multi-sender plan announces every dtype)."""
    from scalerl_mega.weight_sync import dtype_from_name

    if spec.dtype is None:
        raise ValueError(f"weight sync: planned tensor {spec.name!r} has no dtype; resolve it before bucketing")
    n = 1
    for d in spec.shape:
        n *= int(d)
    return n * dtype_from_name(spec.dtype).itemsize


def plan_buckets(specs: list["TensorSpec"], *, bucket_bytes: int) -> list[list["TensorSpec"]]:
    """`weight_sync.iter_buckets` applied to planned tensors: the same boundaries the sender's stream gets."""
    out: list[list] = []
    size = 0
    for s in specs:
        nbytes = spec_bytes(s)
        if out and out[-1] and not (bucket_bytes <= 0 or size + nbytes > bucket_bytes):
            out[-1].append(s)
            size += nbytes
        else:
            out.append([s])
            size = nbytes
    return out
