"""Groups -> TrainBatch (the data flow: groups -> batch -> trainer).

For one optimizer step:
1. flatten the G scored completions of each prompt;
2. zero-variance filter (paper Sec. 3.2 "effective batch"): drop prompts whose rewards are all equal;
3. advantages on the kept samples (Sec. 2 Â_i = r_i - mean_prompt; batch / prompt / no normalization,
   Sec. 3.2 and Sec. 4 Â^norm = Â / Â_std);
4. right-padded [B, T] tensors: prompt + output tokens, next-token targets, loss mask (output tokens the
   policy sampled; an injected interruption phrase has mask 0), generator log-probs, weight versions,
   and the generator's MoE routes per input position when the completions carry them ([B, T, L, K]
   expert ids and gate weights + a [B, T] mask; rollout routing replay);
5. token weights for the loss aggregation, computed once on the whole batch
   (`TrainBatch.token_weights_BT`), so that micro-batch losses sum to the full-batch loss;
6. the micro-batch plan the trainer executes (`pack_micro_batches`): sequences sorted by length and
   cut into micro-batches whose padded size (rows x their own longest row) fits `micro_batch_tokens`,
   or, with `pack_sequences`, packed several to a row (`TrainBatch.micro_batches`: row indices).

Pure tensor code: no I/O, no config objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from scalerl_mega.objective.advantages import compute_advantages, zero_variance_filter
from scalerl_mega.objective.losses import token_weights
from scalerl_mega.types import Completion, Group, ScoredCompletion, TrainBatch


@dataclass(kw_only=True)
class BatchResult:
    """The assembled batch (None when every prompt was filtered out) and its metrics."""

    batch: TrainBatch | None
    metrics: dict[str, float] = field(default_factory=dict)
    kept_groups: list[int] = field(default_factory=list)
    """Indices (into the input list) of the groups that entered the batch."""


def micro_batch_overhead_tokens(max_tokens: int) -> int:
    """The fixed cost the planner charges per micro-batch, in padded tokens: 1/32 of the budget. Without
    it the cheapest plan for rows of distinct lengths would be one row per micro-batch (no padding, but
    a launch, a pipeline fill and a gradient-accumulation step per row)."""
    return max(1, max_tokens // 32)


def pack_micro_batches(lengths: Sequence[int], *, max_tokens: int, pack: bool = False) -> list[list[int]]:
    """THE micro-batch plan of a batch (the trainer executes it as is): lists of row indices, in order
    of decreasing length.

    `pack=False`: each micro-batch is a [rows, longest of its rows] tensor with rows x longest <=
    `max_tokens` (a row longer than the budget gets a micro-batch of its own). The rows are sorted
    by length and cut into consecutive runs by dynamic programming, minimising the padded tokens
    plus `micro_batch_overhead_tokens` per micro-batch (a greedy cut lets one long row pull short
    rows up to its length).
    `pack=True`: each micro-batch is ONE packed row holding its samples back to back (attention
    masked per sample by the trainer), first-fit decreasing with sum of lengths <= `max_tokens`;
    only the trainer's rounding of the packed length (sequence parallelism) is padding.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens} must be > 0")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if pack:
        bins: list[list[int]] = []
        room: list[int] = []
        for i in order:
            for b, free in enumerate(room):
                if lengths[i] <= free:
                    bins[b].append(i)
                    room[b] -= lengths[i]
                    break
            else:
                bins.append([i])
                room.append(max_tokens - lengths[i])
        return bins
    overhead = micro_batch_overhead_tokens(max_tokens)
    n = len(order)
    # cost[j]: cheapest plan of the j longest rows; cut[j]: start of its last micro-batch. A run
    # order[i:j] is padded to lengths[order[i]] (its longest row).
    cost = [0] + [0] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        best, best_i = None, j - 1
        for i in range(j - 1, -1, -1):
            longest = lengths[order[i]]
            if i < j - 1 and longest * (j - i) > max_tokens:
                break
            c = cost[i] + longest * (j - i) + overhead
            if best is None or c <= best:
                best, best_i = c, i
        cost[j], cut[j] = best, best_i
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]


def plan_padding_fraction(lengths: Sequence[int], micro_batches: Sequence[Sequence[int]], *, pack: bool) -> float:
    """Padded share of the tokens the plan executes: 1 - real tokens / (sum over micro-batches of
    rows x longest row, or of the packed length when `pack`)."""
    real = sum(lengths[i] for mb in micro_batches for i in mb)
    executed = sum(sum(lengths[i] for i in mb) if pack else len(mb) * max(lengths[i] for i in mb)
                   for mb in micro_batches)
    return 1.0 - real / float(executed) if executed else 0.0


def build_train_batch(
    groups: Sequence[Group],
    *,
    adv_norm: str,
    adv_eps: float,
    aggregation: str,
    filter_zero_variance: bool,
    micro_batch_tokens: int,
    pack_sequences: bool = False,
    pad_id: int = 0,
    policy_version: int | None = None,
    route_weights: bool = True,
) -> BatchResult:
    """Assemble the TrainBatch of one step from `groups` (see module docstring). `route_weights`:
    carry the engines' MoE gate weights (`moe.routing_replay=ids_and_weights` only)."""
    if not groups:
        raise ValueError("build_train_batch: no groups")
    rows = [(gi, s) for gi, g in enumerate(groups) for s in g.samples]
    rewards_B = torch.tensor([s.reward for _, s in rows], dtype=torch.float64)
    group_B = torch.tensor([gi for gi, _ in rows], dtype=torch.int64)
    keep_B, metrics = _kept_rows(rows, rewards_B, group_B, filter_zero_variance=filter_zero_variance)
    kept_groups = sorted({int(g) for g in group_B[keep_B].tolist()})
    metrics["batch_prompts"] = float(len(kept_groups))
    metrics["batch_samples"] = float(int(keep_B.sum()))
    if not kept_groups:
        return BatchResult(batch=None, metrics=metrics, kept_groups=[])

    idx = keep_B.nonzero().flatten().tolist()
    remap = {g: p for p, g in enumerate(kept_groups)}
    prompt_index_B = torch.tensor([remap[int(group_B[i])] for i in idx], dtype=torch.int64)
    adv_B = compute_advantages(rewards_B[idx], prompt_index_B, normalization=adv_norm, eps=adv_eps)

    comps = [rows[i][1].completion for i in idx]
    lengths = [len(c.prompt_ids) + len(c.output_ids) for c in comps]
    t = _RowTensors.of(comps, T=max(lengths), pad_id=pad_id)
    routes = route_tensors(comps, max(lengths), with_weights=route_weights)

    weights_BT = token_weights(t.loss_mask_BT, prompt_index_B, aggregation)
    micro = pack_micro_batches(lengths, max_tokens=micro_batch_tokens, pack=pack_sequences)
    metrics["batch_tokens_trained"] = float(t.loss_mask_BT.sum())
    metrics["micro_batches"] = float(len(micro))
    metrics["padding_fraction"] = plan_padding_fraction(lengths, micro, pack=pack_sequences)
    metrics["advantage_abs_mean"] = float(adv_B.abs().mean())
    batch = TrainBatch(
        input_ids_BT=t.input_ids_BT, position_ids_BT=t.position_ids_BT, loss_mask_BT=t.loss_mask_BT,
        targets_BT=t.targets_BT, gen_logp_BT=t.gen_logp_BT, advantages_B=adv_B.float(),
        prompt_index_B=prompt_index_B, token_weights_BT=weights_BT, weight_version_BT=t.version_BT,
        route_ids_BTLK=routes[0] if routes else None, route_weights_BTLK=routes[1] if routes else None,
        route_mask_BT=routes[2] if routes else None, policy_version=policy_version, micro_batches=micro,
        lengths_B=lengths, packed=pack_sequences, prompt_ids=[groups[g].prompt.prompt_id for g in kept_groups],
    )
    return BatchResult(batch=batch, metrics=metrics, kept_groups=kept_groups)


def _kept_rows(rows: Sequence[tuple[int, ScoredCompletion]], rewards_B: torch.Tensor, group_B: torch.Tensor, *,
               filter_zero_variance: bool) -> tuple[torch.Tensor, dict[str, float]]:
    """[B] bool mask of the samples that enter the batch (the zero-variance filter, paper Sec. 3.2
    "effective batch", or all) and the filter's metrics."""
    if not filter_zero_variance:
        return torch.ones(len(rows), dtype=torch.bool), {}
    passed_B = torch.tensor([s.passed for _, s in rows], dtype=torch.bool)
    result = zero_variance_filter(rewards_B, group_B, passed=passed_B)
    return result.keep, dict(result.metrics())


@dataclass(frozen=True, kw_only=True)
class _RowTensors:
    """The right-padded [B, T] row tensors of a batch's completions (step 4 of the module doc)."""

    input_ids_BT: torch.Tensor
    position_ids_BT: torch.Tensor
    targets_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    gen_logp_BT: torch.Tensor
    version_BT: torch.Tensor

    @classmethod
    def of(cls, comps: Sequence[Completion], *, T: int, pad_id: int) -> _RowTensors:
        B = len(comps)
        input_ids_BT = torch.full((B, T), pad_id, dtype=torch.int64)
        targets_BT = torch.zeros((B, T), dtype=torch.int64)
        loss_mask_BT = torch.zeros((B, T), dtype=torch.float32)
        gen_logp_BT = torch.zeros((B, T), dtype=torch.float32)
        version_BT = torch.full((B, T), -1, dtype=torch.int64)
        position_ids_BT = torch.arange(T, dtype=torch.int64).expand(B, T).clone()
        for b, c in enumerate(comps):
            P, O = len(c.prompt_ids), len(c.output_ids)
            mask = _checked_mask(c)
            seq = list(c.prompt_ids) + list(c.output_ids)
            input_ids_BT[b, : P + O] = torch.tensor(seq, dtype=torch.int64)
            # Output token j sits at position P + j and is predicted from position P + j - 1.
            sl = slice(P - 1, P - 1 + O)
            targets_BT[b, sl] = torch.tensor(c.output_ids, dtype=torch.int64)
            loss_mask_BT[b, sl] = torch.tensor(mask, dtype=torch.float32)
            gen_logp_BT[b, sl] = torch.tensor(c.gen_logprobs, dtype=torch.float32)
            version_BT[b, sl] = torch.tensor(c.weight_versions, dtype=torch.int64)
        return cls(input_ids_BT=input_ids_BT, position_ids_BT=position_ids_BT,
                   targets_BT=targets_BT * (loss_mask_BT > 0), loss_mask_BT=loss_mask_BT,
                   gen_logp_BT=gen_logp_BT * loss_mask_BT, version_BT=version_BT)


def _checked_mask(c: Completion) -> list[int]:
    """The completion's loss mask over its output tokens, after checking that its per-token lists fit."""
    P, O = len(c.prompt_ids), len(c.output_ids)
    if P == 0:
        raise ValueError(f"completion {c.prompt_id}/{c.sample_index} has no prompt tokens")
    if not (len(c.gen_logprobs) == len(c.weight_versions) == O):
        raise ValueError(
            f"completion {c.prompt_id}/{c.sample_index}: output_ids ({O}), gen_logprobs "
            f"({len(c.gen_logprobs)}) and weight_versions ({len(c.weight_versions)}) differ in length"
        )
    mask = c.mask()
    if len(mask) != O:
        raise ValueError(f"completion {c.prompt_id}/{c.sample_index}: loss_mask has {len(mask)} entries, "
                         f"expected {O}")
    return mask


def route_tensors(comps: Sequence[Completion], T: int, *, with_weights: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None:
    """[B, T, L, K] expert ids, [B, T, L, K] float32 gate weights (None unless `with_weights` and every
    completion has them: only `moe.routing_replay=ids_and_weights` reads them) and the [B, T] float32
    mask of positions with a route, from the completions' `routes` (input position t of row b = the
    prompt + output token at t); None when no completion carries routes. The ids keep the engines'
    compact dtype (`types.route_id_dtype`: uint8 up to 256 experts; int64 if some are plain lists):
    Megatron's router replay widens them per micro-batch (`trainer/megatron/routing.py`). Routes must be
    all or none, with the same layer count and top-k, covering at most the row's positions."""
    import numpy as np

    have = [c.routes is not None for c in comps]
    if not any(have):
        return None
    if not all(have):
        missing = next(c for c in comps if c.routes is None)
        raise ValueError(f"completion {missing.prompt_id}/{missing.sample_index} has no MoE routes while others "
                         "do (a mix of engines with and without route recording)")
    L, K = comps[0].routes.num_layers, comps[0].routes.topk
    B = len(comps)
    dtypes = [c.routes.expert_ids.dtype if isinstance(c.routes.expert_ids, np.ndarray) else np.dtype(np.int64)
              for c in comps]
    ids = torch.zeros((B, T, L, K), dtype=torch.from_numpy(np.zeros(0, np.result_type(*dtypes))).dtype)
    mask = torch.zeros((B, T), dtype=torch.float32)
    with_weights = with_weights and all(len(c.routes.weights) or not c.routes.num_positions for c in comps)
    weights = torch.zeros((B, T, L, K), dtype=torch.float32) if with_weights else None
    for b, c in enumerate(comps):
        r, where = c.routes, f"completion {c.prompt_id}/{c.sample_index}"
        r.check(where=where)
        n = r.num_positions
        if (r.num_layers, r.topk) != (L, K) or n > len(c.prompt_ids) + len(c.output_ids):
            raise ValueError(f"{where}: routes [{n}, {r.num_layers}, {r.topk}] do not fit [{L}, {K}] routes of "
                             f"{len(c.prompt_ids) + len(c.output_ids)} positions")
        if n:
            ids[b, :n] = torch.from_numpy(np.asarray(r.expert_ids).reshape(n, L, K))
            if weights is not None:
                weights[b, :n] = torch.from_numpy(np.asarray(r.weights, dtype=np.float32).reshape(n, L, K))
            mask[b, :n] = 1.0
    return ids, weights, mask
