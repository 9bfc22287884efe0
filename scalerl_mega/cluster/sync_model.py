"""Predicted weight-sync seconds, one sender vs the multi-sender sync (weight_sync/plan.py says who sends what).

A model of the wire and the gathers, not a measurement (bench/weight_sync.py measures the CPU/gloo case):

* bytes: every parameter once in the generator's dtype (`bytes_per_param`, bf16 = 2), the LM head included.
* one sender (trainer rank 0): it gathers the whole model (TP/EP gathers at `gather_gbps`, NVLink class),
  receives every later pipeline stage's tensors over the network (`link_gbps`), then broadcasts all of
  it through its one NIC (`link_gbps`, ~25 GB/s per sender: verl #7167); the steps of a bucket do not
  overlap: `gather + relay + wire`.
* many senders: each stage leader gathers its stage's dense weights, each expert pool leader its pool's
  experts (expert-TP gather; a pool of several expert-parallel ranks gathers them too), all at once; each
  sends through its own NIC: `max over senders (bytes / gather + bytes / link)`. The engines receive every
  byte: an engine node ingests the whole model through at most `nics_per_node` NICs (NCCL forwards inside
  the node over NVLink), a floor of `total / (min(senders, nics_per_node) * link)`.
* experts stored fused per layer (Llama-4 Scout) go with the stage's dense sender: such a model at PP 1
  has one sender, like today.
* not modelled: the engines' load time (SGLang's `load_weights`), the HTTP round trips per bucket, NCCL
  ring latency, the NIC sharing of senders placed on one node beyond one NIC per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalerl_mega.cluster.plan import ModelShape, TrainLayout
from scalerl_mega.weight_sync.plan import DEFAULT_MAX_GROUPS, expert_senders_per_stage

GB = 1e9
FUSED_EXPERTS = frozenset({"scout_17b16e"})
"""Models whose HF checkpoint holds a layer's experts in one tensor (Llama-4's `experts.gate_up_proj`): their
experts travel with the stage's dense sender (weight_sync/plan.py), so they get one sender per pipeline stage."""


@dataclass(frozen=True, kw_only=True)
class SyncLinks:
    link_gbps: float = 25.0
    """One sender's network bandwidth, GB/s (one 200 Gb/s NIC per GPU; verl #7167 measures ~25 GB/s)."""
    gather_gbps: float = 150.0
    """Effective intra-node all-gather bandwidth per GPU, GB/s (NVLink class; an assumption)."""
    nics_per_node: int = 8
    """NICs an engine node receives through (one per GPU on H100/H200 nodes; GB200 trays have 4)."""
    bytes_per_param: int = 2
    """The generator's dtype (bf16)."""


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


def stage_bytes(model: ModelShape, *, pp: int, stage: int, bytes_per_param: int) -> tuple[int, int]:
    """(dense bytes, expert bytes) of pipeline stage `stage`, unsharded: its layers' attention, norms, dense
    MLPs, shared experts and routers, the embedding on the first stage, final norm and LM head on the last."""
    lps = model.layers // pp
    moe = model.stage_moe_layers(pp, stage)
    dense = lps * (model.attention_params() + model.norm_params_per_layer()) + (lps - moe) * model.dense_mlp_params()
    dense += moe * (model.shared_expert_params() + model.router_params())
    if stage == 0:
        dense += model.embedding_params()
    if stage == pp - 1:
        dense += model.hidden + model.head_params()
    return dense * bytes_per_param, moe * model.expert_params_per_layer() * bytes_per_param


def sender_bytes(model: ModelShape, layout: TrainLayout, *, bytes_per_param: int = 2,
                 max_groups: int = DEFAULT_MAX_GROUPS) -> list[int]:
    """Bytes of every multi-sender group (weight_sync.plan's layout: stage leaders first carry pool 0's experts)."""
    ep = layout.ep if model.num_experts and model.name not in FUSED_EXPERTS else 1
    pools = expert_senders_per_stage(pp=layout.pp, ep=ep, max_groups=max_groups)
    out = []
    for s in range(layout.pp):
        dense, experts = stage_bytes(model, pp=layout.pp, stage=s, bytes_per_param=bytes_per_param)
        out += [dense + experts // pools] + [experts // pools] * (pools - 1)
    return out


def predict_sync(model: ModelShape, layout: TrainLayout, links: SyncLinks = SyncLinks(), *,
                 max_groups: int = DEFAULT_MAX_GROUPS) -> SyncPrediction:
    """Single- and multi-sender sync seconds of `model` trained at `layout` (module doc)."""
    per_sender = sender_bytes(model, layout, bytes_per_param=links.bytes_per_param, max_groups=max_groups)
    total = sum(per_sender)
    link, gather = links.link_gbps * GB, links.gather_gbps * GB
    stage0 = sum(stage_bytes(model, pp=layout.pp, stage=0, bytes_per_param=links.bytes_per_param))
    single = total / gather + (total - stage0) / link + total / link
    senders = len(per_sender)
    floor = total / (min(senders, links.nics_per_node) * link)
    multi = max(max(b / gather + b / link for b in per_sender), floor)
    return SyncPrediction(single, multi, senders, max(per_sender), total)
