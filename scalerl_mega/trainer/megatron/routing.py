"""Rollout routing replay on the trainer: the generator's MoE routes, replayed in the
Megatron forward, and the routing-agreement metrics.

Modes (`moe.routing_replay`):

- ``none``: the trainer's routers choose their experts themselves (routes are only compared);
- ``ids``: every MoE router uses the generator's expert ids through Megatron-Core 0.16.1's router
  replay (`moe/router_replay.py`: `RouterReplayAction.REPLAY_FORWARD` with per-layer target indices;
  the model is built with `moe_enable_routing_replay`). Megatron then gathers the trainer's own
  scores at those experts, so the gate weights are recomputed by the trainer (with its gradient);
- ``ids_and_weights``: the same, and the gate weights' forward values are the generator's. Megatron's
  replay only replays indices, so a scoped wrapper around each router's `routing` replaces the probs
  by `w_gen + (p - p.detach())`: the forward value is exactly the generator's weight, the gradient
  reaching the router is that of `ids` (straight-through), so the router still learns.

Token layout: a router sees [S, B] tokens flattened sequence-major (`logits.view(-1, E)` of
[S, B, E]); under sequence parallelism each TP rank holds its contiguous S/tp chunk. Expert ids are
global (0..E-1) on both sides: Megatron's router scores all E experts on every rank (the router weight
is not expert-parallel) and its dispatcher maps the global ids to the EP rank holding the expert, so
the generator's ids are replayed unchanged at any EP size. Layers: the generator records its MoE
layers in ascending order; trainer layer `layer_number` (1-based, global over pipeline stages) is MoE
column `sorted(moe layers).index(layer_number - 1)`.

Positions without a generator route (the last token, padding) replay experts 0..k-1 (k distinct
experts: Megatron's dispatcher moves exactly N*k token copies, a repeated id would lose some): they come after every
trained position of their row (right padding, causal attention), so no trained log-prob depends on
them; they are left out of the metrics.

In-flight weight updates (PipelineRL): a completion's positions carry the route of the weight version
that produced them (`Routes.versions`). All recorded routes are replayed, stale ones included: they are
the behaviour policy's routes (the ones that produced the sampled tokens and the KV the later tokens
attended to), and the CISPO/IS ratio is taken against that behaviour policy's log-probs. The
on-policy metrics restrict to completions generated entirely by the trained weights.

Activation recompute `full` re-runs the routers in backward; it is refused with replay (Megatron's
`REPLAY_BACKWARD` queue would need one target per recomputed micro-batch in schedule order).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

from scalerl_mega.config.run import REPLAY_MODES  # the one list, next to `moe.routing_replay`

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    import torch
    from megatron.core.transformer.moe.router import TopKRouter

    from scalerl_mega.model.config import ModelConfig

SELECTIONS = ("", "_onpolicy")
"""Metric suffixes: all trained positions with a route; those of on-policy completions."""


def moe_columns(model_cfg: ModelConfig) -> dict[int, int]:
    """0-based global layer index -> column of that MoE layer in the generator's routes."""
    layers = [i for i in range(model_cfg.num_layers) if model_cfg.is_moe_layer(i)]
    return {layer: j for j, layer in enumerate(layers)}


def local_routers(chunks: list, model_cfg: ModelConfig) -> list[tuple[int, TopKRouter]]:
    """(route column, TopKRouter) of every MoE layer this rank holds, in layer order."""
    from scalerl_mega.trainer.megatron.models import unwrap_gpt

    cols = moe_columns(model_cfg)
    out = []
    for chunk in chunks:
        decoder = getattr(unwrap_gpt(chunk), "decoder", None)
        for layer in getattr(decoder, "layers", []):
            router = getattr(getattr(layer, "mlp", None), "router", None)
            if router is not None:
                out.append((cols[int(layer.layer_number) - 1], router))
    return out


class RouteTracker:
    """Replays routes and accumulates agreement counts over one step's micro-batches (on this rank's
    layers and tokens); `reduce()` sums them over the data-parallel, pipeline and (under sequence
    parallelism) tensor-parallel groups and returns the metrics."""

    def __init__(self, chunks: list, model_cfg: ModelConfig, *, mode: str) -> None:
        import torch

        if mode not in REPLAY_MODES:
            raise ValueError(f"moe.routing_replay={mode!r} is not one of {list(REPLAY_MODES)}")
        self.mode = mode
        self.routers = local_routers(chunks, model_cfg)
        self.num_layers = len(moe_columns(model_cfg))
        device = next(chunks[0].parameters()).device
        # [layer, selection, (agree, natural_agree, tokens)]
        self.counts = torch.zeros((self.num_layers, len(SELECTIONS), 3), dtype=torch.float64, device=device)
        self.seen = False
        if mode != "none":
            for _, router in self.routers:
                if getattr(router, "router_replay", None) is None:
                    raise ValueError(f"moe.routing_replay={mode!r}: the model was built without "
                                     "moe_enable_routing_replay (no RouterReplay on its routers)")

    @contextlib.contextmanager
    def scope(self, mb: dict) -> Iterator[None]:
        """Around one micro-batch's model forward: set the replay targets and wrap `routing`."""
        if not self.routers or "route_ids" not in mb:
            yield
            return
        import torch

        self.seen = True
        if self.mode == "ids_and_weights" and "route_weights" not in mb:
            raise ValueError("moe.routing_replay='ids_and_weights': the generator reported expert ids without "
                             "gate weights (SGLang returns ids only); use moe.routing_replay=ids")
        tokens = _token_layout(mb, sequence_parallel=_sequence_parallel(self.routers))
        unrouted_N = _flat(mb["route_mask"], tokens) == 0
        installed = []
        try:
            for col, router in self.routers:
                # the batch carries compact ids (uint8 up to 256 experts); RouterReplay and scatter index int64
                ids_NK = _flat(mb["route_ids"][:, :, col], tokens).long()
                # k distinct experts where no route was recorded: the dispatcher sends N*k token copies
                # (megatron-core >= 0.17 sizes its buffers so), a repeated id would drop some
                ids_NK[unrouted_N] = torch.arange(ids_NK.shape[1], device=ids_NK.device)
                w_NK = _flat(mb["route_weights"][:, :, col], tokens) if "route_weights" in mb else None
                if self.mode != "none":
                    from megatron.core.transformer.moe.router_replay import RouterReplayAction

                    rr = router.router_replay
                    rr.clear_indices()
                    rr.set_target_indices(ids_NK)
                    rr.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
                router.routing = self._wrap(router, col, ids_NK, w_NK, tokens["select"])
                installed.append(router)
            yield
        finally:
            for router in installed:
                del router.routing  # back to the class method
                if router.router_replay is not None:
                    router.router_replay.clear_router_replay_action()
                    router.router_replay.clear_indices()

    def _wrap(self, router: TopKRouter, col: int, ids_NK: torch.Tensor, w_NK: torch.Tensor | None,
              select_SN: torch.Tensor) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        import torch

        original = type(router).routing.__get__(router)
        natural_ok = router.expert_bias is None and not router.config.moe_router_group_topk

        def routing(logits, padding_mask=None):
            probs, routing_map = original(logits, padding_mask=padding_mask)
            with torch.no_grad():
                E = routing_map.shape[-1]
                gen_map = torch.zeros_like(routing_map).scatter(1, ids_NK, True)
                agree = (routing_map == gen_map).all(-1).double()
                if natural_ok:  # the router's own top-k (softmax/sigmoid are monotonic in the logits)
                    nat = torch.topk(logits.view(-1, E), router.topk, dim=1).indices
                    natural = (torch.zeros_like(routing_map).scatter(1, nat, True) == gen_map).all(-1).double()
                else:
                    natural = torch.full_like(agree, float("nan"))
                for s, sel in enumerate(select_SN):
                    sel = sel.double()
                    self.counts[col, s] += torch.stack([(agree * sel).sum(), (natural * sel).sum(), sel.sum()])
            if self.mode == "ids_and_weights":
                gen = torch.zeros_like(probs).scatter(1, ids_NK, w_NK.to(probs.dtype))
                probs = gen + (probs - probs.detach())
            return probs, routing_map

        return routing

    def reduce(self) -> dict[str, float]:
        """Global agreement metrics (empty if no micro-batch carried routes on any rank)."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        counts = self.counts
        seen = torch.tensor([float(self.seen)], dtype=torch.float64, device=counts.device)
        groups = []
        if ps.get_pipeline_model_parallel_world_size() > 1:
            groups.append(ps.get_pipeline_model_parallel_group())
        if ps.get_data_parallel_world_size() > 1:
            groups.append(ps.get_data_parallel_group())
        tp = ps.get_tensor_model_parallel_world_size()
        if tp > 1 and _sequence_parallel(self.routers):
            groups.append(ps.get_tensor_model_parallel_group())
        for group in groups:
            dist.all_reduce(counts, group=group)
            dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=group)
        if not float(seen):
            return {}
        return agreement_metrics(counts.cpu())


def agreement_metrics(counts_LS3: torch.Tensor) -> dict[str, float]:
    """[layer, selection, (agree, natural_agree, tokens)] global sums -> `routing_agreement[_onpolicy]`
    (routes the trainer used == the generator's), `routing_agreement_natural[_onpolicy]` (the
    trainer router's own top-k == the generator's), each the fraction of (token, MoE layer) pairs; per
    layer `routing_agreement/layer{j}`; `routing_tokens[_onpolicy]`, the tokens counted (every MoE layer
    sees the same tokens). A ratio over zero tokens is left out."""
    out: dict[str, float] = {}
    total = counts_LS3.sum(0)
    for s, suffix in enumerate(SELECTIONS):
        agree, natural, n = (float(x) for x in total[s])
        out[f"routing_tokens{suffix}"] = n / counts_LS3.shape[0]
        if n > 0:
            out[f"routing_agreement{suffix}"] = agree / n
            out[f"routing_agreement_natural{suffix}"] = natural / n
    for j in range(counts_LS3.shape[0]):
        n = float(counts_LS3[j, 0, 2])
        if n > 0:
            out[f"routing_agreement/layer{j}"] = float(counts_LS3[j, 0, 0]) / n
    return out


def _sequence_parallel(routers: list) -> bool:
    return bool(routers) and bool(routers[0][1].config.sequence_parallel)


def _token_layout(mb: dict, *, sequence_parallel: bool) -> dict[str, Any]:
    """This rank's slice of the sequence (sequence parallelism) and the selections, as flat
    sequence-major [S_local * B] masks."""
    from megatron.core import parallel_state as ps

    T = int(mb["input_ids"].shape[1])
    tp = ps.get_tensor_model_parallel_world_size()
    lo, hi = 0, T
    if tp > 1 and sequence_parallel:
        chunk = T // tp
        lo = ps.get_tensor_model_parallel_rank() * chunk
        hi = lo + chunk
    routed = (mb["route_mask"] > 0) & (mb["loss_mask"] > 0)
    selects = [routed]
    if "trainer_version" in mb and "weight_version" in mb:
        m = mb["loss_mask"] > 0
        whole_B = ((mb["weight_version"] == mb["trainer_version"]) | ~m).all(1)
        selects.append(routed & whole_B[:, None])
    else:
        selects.append(routed & False)
    tokens = {"lo": lo, "hi": hi}
    tokens["select"] = [_flat(s, tokens) for s in selects]
    return tokens


def _flat(x_BT: torch.Tensor, tokens: dict) -> torch.Tensor:
    """[B, T, ...] -> this rank's [S_local * B, ...] in the router's sequence-major token order."""
    x = x_BT[:, tokens["lo"]:tokens["hi"]].transpose(0, 1)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]).contiguous()
