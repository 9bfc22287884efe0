"""Predicted weight-sync seconds: one sender or one per pipeline stage and expert pool (weight_sync/plan.py says who
sends what), into SGLang servers or local engines, and the floor each one hits.

A model of the wire, the receivers and the gathers, not a measurement (bench/weight_sync.py measures the CPU/gloo
case). Every byte of the model is sent once, `bytes_per_param` each (bf16 = 2; a parameter so other dtypes fit), or
with `quantization="fp8"` the projections in blockwise FP8 plus their scales and the rest at `bytes_per_param`,
counted matrix by matrix (cluster/weight_bytes.py).

* Broadcast: a group holds its sender and every engine rank; a broadcast delivers every byte of the group to every
  receiving rank. NCCL pipelines it down a ring/tree, so one group moves at the slowest link on its path: the
  sender's NIC (`link_gbps`) or a receiving rank's (`recv_gbps`), `w = min(link, recv)`, however many ranks
  receive. Every engine rank ingests the whole model: the receiver floor `total / recv` holds for any sender mode.
* One sender (trainer rank 0): it gathers the whole model (TP/EP gathers at `gather_gbps`), receives every later
  pipeline stage's tensors over its NIC (the relay), and broadcasts everything; the code gathers a bucket, then
  sends it, so nothing overlaps: `total / gather + relay / link + total / w`.
* Per stage into local engines: an engine receives all groups at once (one thread each), every sender gathers and
  sends its own share at the same time: `max(max over senders (b / gather + b / w), total / recv)`.
* Per stage into SGLang: a server takes one control request at a time and all servers take the buckets in one
  shared order (rollout/sglang/multi_groups.py), so the groups' broadcasts run one after another at `w`. The other
  senders gather while one sends (gather and send overlap across senders; within a sender they alternate):
  `max(first bucket / gather + total / w, max over senders (b / gather + b / w))`.
* Experts stored fused per layer (Llama-4 Scout) go with the stage's dense sender: such a model at PP 1 has one
  group, so both modes are the same there.
* Not modelled: the engines' load time (`load_weights`), HTTP round trips per bucket, NCCL latency, NIC sharing
  between senders on one node. Peers that send each receiving rank only its own shard (shard-to-shard transfer,
  many sender-receiver pairs at once) are not bound by `total / recv`; a broadcast is.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalerl_mega.cluster.plan import ModelShape, TrainLayout
from scalerl_mega.cluster.weight_bytes import FUSED_EXPERTS, layer_part_bytes, mixer_bytes, router_params
from scalerl_mega.weight_sync import DEFAULT_BUCKET_BYTES
from scalerl_mega.weight_sync.plan import DEFAULT_MAX_GROUPS, expert_senders_per_stage

GB = 1e9
BACKENDS = ("sglang", "local")
SENDER_MODES = ("single", "per_stage")
BOUNDS = {
    "sender_nic": "a sender's NIC carries its bytes",
    "receiver_nic": "every engine rank ingests the whole model through its NIC",
    "receiver_serial": "every engine rank ingests the whole model, one group at a time (SGLang)",
    "gather": "a sender gathers its share",
    "relay": "rank 0 receives the later stages' tensors",
}
"""What sets a floor (`SyncEstimate.bound`)."""


@dataclass(frozen=True, kw_only=True)
class SyncLinks:
    link_gbps: float = 25.0
    """One sender's network bandwidth, GB/s (one 200 Gb/s NIC per GPU; verl #7167 measures ~25 GB/s)."""
    recv_gbps: float = 25.0
    """One receiving engine rank's network bandwidth, GB/s (its GPU's NIC)."""
    gather_gbps: float = 150.0
    """Effective intra-node all-gather bandwidth per GPU, GB/s (NVLink class; an assumption)."""
    bytes_per_param: int = 2
    """The weights' dtype (bf16); under FP8, that of the tensors left unquantized."""
    quantization: str = "none"
    """`rollout.quantization`: "fp8" sends the projections in blockwise FP8 with their scales
    (cluster/weight_bytes.py)."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Bucket size (`sync.bucket_bytes`): the first bucket's gather is not hidden on SGLang."""


@dataclass(frozen=True)
class SyncEstimate:
    """One (backend, sender mode) of a layout: modelled seconds, the largest floor and what sets it."""

    backend: str
    senders: str
    seconds: float
    floor_s: float
    bound: str
    groups: int
    max_sender_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class SyncPrediction:
    single_sender_s: float
    multi_sender_s: float
    senders: int
    max_sender_bytes: int
    total_bytes: int

    def as_json(self) -> dict:
        return {"single_sender_s": round(self.single_sender_s, 3), "multi_sender_s": round(self.multi_sender_s, 3),
                "senders": self.senders, "max_sender_bytes": self.max_sender_bytes}


def stage_bytes(model: ModelShape, *, pp: int, stage: int, bytes_per_param: int,
                quantization: str = "none") -> tuple[int, int]:
    """(dense bytes, expert bytes) of pipeline stage `stage`, unsharded: its layers' attention, norms, dense
    MLPs, shared experts and routers, the embedding on the first stage, final norm and LM head on the last.
    `quantization="fp8"`: the projections in blockwise FP8 with their scales, the rest at `bytes_per_param`
    (cluster/weight_bytes.py)."""
    part = layer_part_bytes(model, dtype_bytes=bytes_per_param, quantization=quantization)
    lps = model.layers // pp
    moe = model.stage_moe_layers(pp, stage)
    dense = mixer_bytes(model, layers=range(stage * lps, (stage + 1) * lps), dtype_bytes=bytes_per_param,
                        quantization=quantization)
    dense += (lps - moe) * part["dense_mlp"] + moe * (part["shared_expert"] + router_params(model) * bytes_per_param)
    if stage == 0:
        dense += model.embedding_params() * bytes_per_param
    if stage == pp - 1:
        dense += (model.hidden + model.head_params()) * bytes_per_param
    return dense, moe * part["experts"]


def sender_bytes(model: ModelShape, layout: TrainLayout, *, bytes_per_param: int = 2, quantization: str = "none",
                 max_groups: int = DEFAULT_MAX_GROUPS) -> list[int]:
    """Bytes of every per-stage group (weight_sync.plan's layout: stage leaders first carry pool 0's experts)."""
    ep = layout.ep if model.num_experts and model.name not in FUSED_EXPERTS else 1
    pools = expert_senders_per_stage(pp=layout.pp, ep=ep, max_groups=max_groups)
    out = []
    for s in range(layout.pp):
        dense, experts = stage_bytes(model, pp=layout.pp, stage=s, bytes_per_param=bytes_per_param,
                                     quantization=quantization)
        out += [dense + experts // pools] + [experts // pools] * (pools - 1)
    return out


def _floor(candidates: list[tuple[str, float]]) -> tuple[float, str]:
    """The largest floor and its name (the first listed wins a tie)."""
    best = max(v for _, v in candidates)
    return best, next(n for n, v in candidates if v == best)


def estimate_sync(model: ModelShape, layout: TrainLayout, links: SyncLinks = SyncLinks(), *, backend: str,
                  senders: str, max_groups: int = DEFAULT_MAX_GROUPS) -> SyncEstimate:
    """Seconds and floor of one weight update of `model` trained at `layout` (module doc)."""
    if backend not in BACKENDS or senders not in SENDER_MODES:
        raise ValueError(f"weight sync model: backend={backend!r} / senders={senders!r}; expected one of "
                         f"{BACKENDS} / {SENDER_MODES}")
    per = sender_bytes(model, layout, bytes_per_param=links.bytes_per_param, quantization=links.quantization,
                       max_groups=max_groups)
    total = sum(per)
    link, recv, gather = links.link_gbps * GB, links.recv_gbps * GB, links.gather_gbps * GB
    w = min(link, recv)
    if senders == "single":
        stage0 = sum(stage_bytes(model, pp=layout.pp, stage=0, bytes_per_param=links.bytes_per_param,
                                 quantization=links.quantization))
        relay = total - stage0
        seconds = total / gather + relay / link + total / w
        floor, bound = _floor([("sender_nic", total / link), ("receiver_nic", total / recv),
                               ("gather", total / gather), ("relay", relay / link)])
        return SyncEstimate(backend, senders, seconds, floor, bound, 1, total, total)
    largest = max(b / gather + b / w for b in per)
    nic = [("sender_nic", max(per) / link)]
    if backend == "local":
        seconds = max(largest, total / recv)
        floor, bound = _floor(nic + [("receiver_nic", total / recv), ("gather", max(per) / gather)])
    else:
        first = min(links.bucket_bytes, per[0]) if links.bucket_bytes > 0 else min(per)
        seconds = max(first / gather + total / w, largest)
        floor, bound = _floor(nic + [("receiver_serial", total / w), ("gather", max(per) / gather)])
    return SyncEstimate(backend, senders, seconds, floor, bound, len(per), max(per), total)


def faster_senders(model: ModelShape, layout: TrainLayout, links: SyncLinks = SyncLinks(), *,
                   backend: str = "sglang", max_groups: int = DEFAULT_MAX_GROUPS) -> str:
    """"per_stage" when the model predicts it strictly faster than one sender on `backend`, else "single" (one
    group either way, or no gain: the simpler path)."""
    one, many = (estimate_sync(model, layout, links, backend=backend, senders=s, max_groups=max_groups).seconds
                 for s in SENDER_MODES)
    return "per_stage" if many < one else "single"


def predict_sync(model: ModelShape, layout: TrainLayout, links: SyncLinks = SyncLinks(), *,
                 backend: str = "sglang", max_groups: int = DEFAULT_MAX_GROUPS) -> SyncPrediction:
    """One sender vs per-stage senders into `backend` (the shipped scripts' generators are SGLang servers)."""
    one, many = (estimate_sync(model, layout, links, backend=backend, senders=s, max_groups=max_groups)
                 for s in SENDER_MODES)
    return SyncPrediction(one.seconds, many.seconds, many.groups, many.max_sender_bytes, many.total_bytes)
