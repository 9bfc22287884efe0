"""Slot KV cache for continuous batching on the HF `transformers` attention (no copies per step).

Layout: per layer one key and one value buffer `[S, H_kv, C, D]` (S slots, C columns). All active
rows share one write column `length` (L): a decode step writes every row's new key/value at column
L. A row's tokens occupy a contiguous, right-aligned run of columns `[start_r, L)`; columns before
`start_r` are masked out by the 2-D attention mask (`mask_SC`) and hold zeros (never NaN, so a
masked 0-weight times the value stays 0).

* Active rows are kept in slots `0..n-1`, so a decode step works on views `buf[:n]` (no gather).
  A finished row is replaced by the last active row (one row copy).
* Admission writes a batched, left-padded prefill straight into the slot rows at columns
  `[L - P_max, L)`.
* When L reaches the capacity C, or a prefill needs more room on the left, the used columns are
  moved (`relayout`): an O(cache) copy that happens once every ~C/2 steps.

`hf_cache(n)` wraps the buffers in a `transformers` `Cache` whose layers write in place.

Hybrid models (Qwen3.5, Qwen3-Next: `recurrent=`) hold K/V buffers for their full-attention layers only; their
Gated DeltaNet layers keep a fixed-size state per slot instead (`recurrent_state.SlotRecurrentState`), which moves
with its row and has no columns (a relayout leaves it alone).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.rollout.recurrent_state import RecurrentSpec


def _make_layer_class():
    from transformers.cache_utils import DynamicLayer

    class _SlotLayer(DynamicLayer):
        """A cache layer writing into a preallocated buffer view (`[n, H, C, D]`) at column `length`."""

        def __init__(self, keys_buf, values_buf, length: int):
            super().__init__()
            self._kbuf = keys_buf
            self._vbuf = values_buf
            self._len = length
            self.dtype, self.device = keys_buf.dtype, keys_buf.device
            self.is_initialized = True
            self.keys = keys_buf[:, :, :length]
            self.values = values_buf[:, :, :length]

        def lazy_initialization(self, key_states, value_states) -> None:  # already initialized
            return None

        def update(self, key_states, value_states, *args, **kwargs):
            t = key_states.shape[-2]
            end = self._len + t
            if end > self._kbuf.shape[2]:
                raise RuntimeError(f"slot KV cache overflow: {end} > capacity {self._kbuf.shape[2]}")
            self._kbuf[:, :, self._len : end] = key_states
            self._vbuf[:, :, self._len : end] = value_states
            self._len = end
            self.keys = self._kbuf[:, :, :end]
            self.values = self._vbuf[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._len

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self._len + query_length, 0

    return _SlotLayer


class SlotKVCache:
    """Preallocated per-layer K/V buffers with slot rows and a shared write column (see module doc)."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: "torch.dtype",
        device: "torch.device | str" = "cpu",
        value_head_dim: int | None = None,
        recurrent: "RecurrentSpec | None" = None,
    ) -> None:
        """`value_head_dim`: the value width when it differs from the key's (DeepSeek-V3's MLA caches the
        compressed KV as its "keys" and the RoPE key as its "values", one head each). `recurrent`: the GDN
        layers of a hybrid model, which get a per-slot recurrent state instead of K/V buffers."""
        import torch

        from scalerl_mega.rollout.recurrent_state import SlotRecurrentState

        if capacity < 2:
            raise ValueError(f"SlotKVCache capacity={capacity} must be >= 2")
        shape = (num_slots, num_kv_heads, capacity, head_dim)
        vshape = (num_slots, num_kv_heads, capacity, value_head_dim or head_dim)
        linear = set(recurrent.layers) if recurrent is not None else set()
        self.attn_layers = [i for i in range(num_layers) if i not in linear]
        """The layers with K/V buffers (`keys[j]` belongs to layer `attn_layers[j]`)."""
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.attn_layers]
        self.values = [torch.zeros(vshape, dtype=dtype, device=device) for _ in self.attn_layers]
        self.states = (SlotRecurrentState(recurrent, num_slots=num_slots, dtype=dtype, device=device)
                       if recurrent is not None else None)
        self.num_layers = num_layers
        self.mask_SC = torch.zeros((num_slots, capacity), dtype=torch.bool, device=device)
        self.start_S = [0] * num_slots
        self.capacity = capacity
        self.num_slots = num_slots
        self.length = 0
        self._layer_cls = _make_layer_class()

    # ---- views handed to the HF model ------------------------------------------------------
    def hf_cache(self, rows: slice, *, column_offset: int = 0, length: int | None = None):
        """A `transformers` Cache over slot rows `rows`, starting at `column_offset`, `length` used. A GDN
        layer's recurrent state starts from zero when `length` is 0 (a prefill), else continues."""
        from transformers.cache_utils import Cache

        length = self.length - column_offset if length is None else length
        layers: list = [None] * self.num_layers
        for i, k, v in zip(self.attn_layers, self.keys, self.values):
            layers[i] = self._layer_cls(k[rows, :, column_offset:], v[rows, :, column_offset:], length)
        if self.states is not None:
            for i in self.states.spec.layers:
                layers[i] = self.states.hf_layer(i, rows, fresh=length == 0)
        return Cache(layers=layers)

    # ---- slot management --------------------------------------------------------------------
    def move_row(self, src: int, dst: int) -> None:
        """Copy slot `src` into slot `dst` (used to keep active rows contiguous)."""
        if src == dst:
            return
        for k, v in zip(self.keys, self.values):
            k[dst].copy_(k[src])
            v[dst].copy_(v[src])
        self.mask_SC[dst].copy_(self.mask_SC[src])
        self.start_S[dst] = self.start_S[src]
        if self.states is not None:
            self.states.move_row(src, dst)

    def clear_row_prefix(self, row: int, start: int) -> None:
        """Zero row `row` left of column `start` and mark `[start, length)` valid."""
        for k, v in zip(self.keys, self.values):
            k[row, :, :start].zero_()
            v[row, :, :start].zero_()
        self.mask_SC[row].zero_()
        self.mask_SC[row, start : self.length] = True
        self.start_S[row] = start

    def relayout(self, *, n_active: int, new_length: int) -> None:
        """Move the used columns of the first `n_active` rows so that the write column becomes
        `new_length` (content stays right-aligned). Raises if the rows do not fit."""
        if n_active == 0:
            self.length = new_length
            return
        min_start = min(self.start_S[:n_active])
        width = self.length - min_start
        if width > new_length or new_length > self.capacity:
            raise RuntimeError(
                f"slot KV cache cannot fit {width} used columns at length {new_length} "
                f"(capacity {self.capacity}); raise max_seq_len"
            )
        shift = new_length - self.length
        src = slice(min_start, self.length)
        dst = slice(min_start + shift, new_length)
        for buf in (*self.keys, *self.values):
            block = buf[:n_active, :, src].clone()
            buf[:n_active].zero_()
            buf[:n_active, :, dst] = block
        m = self.mask_SC[:n_active, src].clone()
        self.mask_SC[:n_active].zero_()
        self.mask_SC[:n_active, dst] = m
        for r in range(n_active):
            self.start_S[r] += shift
        self.length = new_length
