"""The executed micro-batches of a training step: the batch's plan (`batch.pack_micro_batches`), split
over data-parallel ranks, each micro-batch cut from the batch's [B, T] tensors.

- `MicroBatchPlan`: the global plan (row indices per micro-batch, row lengths, packed or not). Every
  rank derives the same plan from the same batch (the controller broadcasts it, trainer/ranks.py).
- `rank_share`: the micro-batches of one DP rank: micro-batch i goes to rank i mod dp; every rank
  gets the same number (Megatron's schedule and expert-parallel all-to-alls run in lock step across
  DP ranks), so a rank short of one executes a filler: a one-token row that trains nothing.
- `cut_micro_batch`: the tensors of one micro-batch. Unpacked: its rows, trimmed to its own longest
  row (rounded up to `cols_multiple`, the TP size under sequence parallelism). Packed: the samples
  back to back in ONE row [1, L] (`input_ids`, `position_ids` restarting at 0 per sample,
  `packed_targets`, `packed_loss_mask`, `cu_seqlens`), while the loss tensors stay row-wise per sample
  [n, longest] and `unpack_index` [n, longest] maps each of their positions to its packed position
  (`unpack`), so the loss functions see the same tensors packed or not.

Every micro-batch carries `padding_mask` (True at padded positions of the model input; MoE routing
and its auxiliary loss skip them) and its token counts `executed_tokens` (the model input's size)
and `real_tokens` (the samples' tokens): the step sums them over micro-batches and DP ranks into the
exact executed `padding_fraction`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: keys that carry the loss signal: zeroed in a filler micro-batch (weight version -> -1)
_LOSS_KEYS = ("loss_mask", "token_weights", "advantages", "gen_logp", "targets")


@dataclass(frozen=True, kw_only=True)
class MicroBatchPlan:
    micro_batches: list[list[int]]
    """Row indices of each micro-batch."""
    lengths: list[int]
    """Unpadded length of each row of the batch."""
    packed: bool = False


def plan_of(*, rows: int, seq_len: int, micro_batches: list[list[int]] | None = None,
            lengths: list[int] | None = None, packed: bool = False, micro_batch_tokens: int | None = None,
            micro_batch_size: int = 1) -> MicroBatchPlan:
    """The plan to execute: `micro_batches` when given (a TrainBatch's own plan); otherwise planned by
    `batch.pack_micro_batches` on `lengths` (default: every row `seq_len` long) under
    `micro_batch_tokens`, or, without a budget, `micro_batch_size` rows at a time in order."""
    from scalerl_mega.batch import pack_micro_batches

    lengths = [int(seq_len)] * rows if not lengths else [int(n) for n in lengths]
    if len(lengths) != rows:
        raise ValueError(f"micro-batch plan: {len(lengths)} lengths for {rows} rows")
    if micro_batches:
        planned = sorted(i for mb in micro_batches for i in mb)
        if planned != list(range(rows)):
            raise ValueError(f"micro-batch plan: the micro-batches must hold each of the {rows} rows once, "
                             f"got {micro_batches}")
        return MicroBatchPlan(micro_batches=[list(mb) for mb in micro_batches], lengths=lengths, packed=packed)
    if micro_batch_tokens is not None:
        return MicroBatchPlan(micro_batches=pack_micro_batches(lengths, max_tokens=micro_batch_tokens, pack=packed),
                              lengths=lengths, packed=packed)
    if packed:
        raise ValueError("packed sequences need a token budget (micro_batch_tokens)")
    size = max(1, int(micro_batch_size))
    return MicroBatchPlan(micro_batches=[list(range(i, min(i + size, rows))) for i in range(0, rows, size)],
                          lengths=lengths, packed=False)


def rank_share(micro_batches: list[list[int]], *, dp: int, dp_rank: int) -> list[list[int]]:
    """Micro-batches i with i mod dp == dp_rank, padded with fillers (`[]`) to ceil(n / dp)."""
    per_rank = -(-len(micro_batches) // dp)
    mine = [list(mb) for mb in micro_batches[dp_rank::dp]]
    return mine + [[] for _ in range(per_rank - len(mine))]


def aux_loss_weight(*, n_micro_batches: int, dp: int, filler: bool) -> float:
    """Factor on the MoE auxiliary-loss coefficient for one executed micro-batch, so the step's
    auxiliary loss is the mean over the plan's `n_micro_batches` real micro-batches whatever `dp`.

    Megatron scales each micro-batch's auxiliary-loss gradient by 1 / (micro-batches on this rank)
    and DDP averages over the dp ranks: with fillers (`rank_share`) every rank runs ceil(n / dp), so
    a real micro-batch weighs 1 / (dp * ceil(n / dp)) where one rank gives it 1 / n, and the filler
    adds its own one-token auxiliary loss. The factor dp * ceil(n / dp) / n restores 1 / n for real
    micro-batches; a filler gets 0 (its router still runs: expert-parallel all-to-alls need it)."""
    if n_micro_batches < 1 or dp < 1:
        raise ValueError(f"aux_loss_weight: n_micro_batches={n_micro_batches}, dp={dp} must be >= 1")
    if filler:
        return 0.0
    return dp * -(-n_micro_batches // dp) / n_micro_batches


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _rowwise_cut(data: dict, rows_idx: torch.Tensor, cols: int) -> dict:
    """Rows `rows_idx` of every row-wise tensor of `data`, [B, T, ...] ones cut to `cols` columns
    (zero / -1 / continued-position columns appended beyond T, as `policy_loss.pad_batch`)."""
    import torch

    from scalerl_mega.trainer.policy_loss import pad_batch

    B, T = (int(n) for n in data["input_ids"].shape[:2])
    out = {}
    for key, value in data.items():
        if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == B:
            value = value[rows_idx.to(value.device)]
            if value.dim() >= 2 and value.shape[1] == T:
                value = value[:, :cols]
        out[key] = value
    width = int(out["input_ids"].shape[1])
    return pad_batch(out, cols_multiple=cols) if width < cols else out


def cut_micro_batch(data: dict, rows: list[int], lengths: list[int], *, packed: bool,
                    cols_multiple: int = 1) -> dict:
    """The micro-batch of `rows` (see module doc); `rows == []`: a filler that trains nothing."""
    import torch

    filler = not rows
    idx = torch.tensor(rows or [0], dtype=torch.int64)
    lens = [1] if filler else [int(lengths[i]) for i in rows]
    if not packed or filler:
        cols = _round_up(max(lens), cols_multiple)
        mb = _rowwise_cut(data, idx, cols)
        mb["padding_mask"] = torch.arange(cols)[None, :] >= torch.tensor(lens)[:, None]
    else:
        mb = _pack(data, idx, lens, cols_multiple=cols_multiple)
    if filler:
        for key in _LOSS_KEYS:
            if key in mb:
                mb[key] = torch.zeros_like(mb[key])
        if "weight_version" in mb:
            mb["weight_version"] = torch.full_like(mb["weight_version"], -1)
        mb["padding_mask"] = torch.zeros_like(mb["padding_mask"])  # MoE routing needs >= 1 token
    mb["rows"] = torch.tensor(rows, dtype=torch.int64)
    mb["executed_tokens"] = torch.tensor(float(mb["input_ids"].numel()), dtype=torch.float64)
    mb["real_tokens"] = torch.tensor(0.0 if filler else float(sum(lens)), dtype=torch.float64)
    return mb


def _pack(data: dict, idx: torch.Tensor, lens: list[int], *, cols_multiple: int) -> dict:
    """Samples `idx` (lengths `lens`) back to back in one row, with the row-wise loss view."""
    import torch

    longest, total = max(lens), sum(lens)
    L = _round_up(total, cols_multiple)
    mb = _rowwise_cut(data, idx, longest)
    starts = torch.tensor([0, *lens]).cumsum(0)  # [n + 1]
    t = torch.arange(longest)
    # position t of sample s -> packed position starts[s] + t (its last token beyond its length)
    mb["unpack_index"] = starts[:-1, None] + torch.minimum(t[None, :], torch.tensor(lens)[:, None] - 1)
    flat = mb["unpack_index"]
    valid = t[None, :] < torch.tensor(lens)[:, None]

    def packed_row(value, fill: int | float = 0):
        row = torch.full((1, L), fill, dtype=value.dtype, device=value.device)
        row[0, flat[valid].to(value.device)] = value[valid.to(value.device)]
        return row

    mb["packed_targets"] = packed_row(mb["targets"])
    mb["packed_loss_mask"] = packed_row(mb["loss_mask"])
    mb["input_ids"] = packed_row(mb["input_ids"])
    seg_start = torch.zeros(L, dtype=torch.int64)
    seg_start[:total] = torch.repeat_interleave(starts[:-1], torch.tensor(lens))
    seg_start[total:] = total
    positions = torch.arange(L) - seg_start
    mb["position_ids"] = positions[None, :].to(data["position_ids"].device)
    cu = [*starts.tolist(), *([L] if L > total else [])]  # the tail padding is a segment of its own
    mb["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    mb["max_seqlen"] = max(longest, L - total)
    mb["padding_mask"] = (torch.arange(L) >= total)[None, :]
    return mb


def unpack(packed_1L: torch.Tensor, unpack_index: torch.Tensor) -> torch.Tensor:
    """[1, L, ...] packed values -> [n, longest, ...] per sample (`cut_micro_batch`); differentiable."""
    return packed_1L[0][unpack_index.to(packed_1L.device)]


def block_causal_mask(cu_seqlens: torch.Tensor, length: int, *, device: torch.device | str | None = None
                      ) -> torch.Tensor:
    """[1, 1, L, L] bool attention mask of a packed row, True where attention is masked out: position q
    attends to k only within its own sample (segments of `cu_seqlens`) and only to k <= q. The mask
    Megatron's local (non-TE) `DotProductAttention` takes instead of its default causal mask."""
    import torch

    seg = torch.zeros(length, dtype=torch.int64, device=device)
    bounds = cu_seqlens[1:-1].to(device=device, dtype=torch.int64)
    seg[bounds] = 1
    seg = seg.cumsum(0)
    pos = torch.arange(length, device=device)
    allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    return (~allowed)[None, None]
