"""Per-slot recurrent state of the Gated DeltaNet layers (Qwen3.5, Qwen3-Next) beside the slot KV cache.

A GDN layer keeps no per-token cache: each request carries a fixed-size state per layer,
* the causal convolution's input window `[conv_dim, K]` (the last K pre-convolution q/k/v columns), and
* the gated delta rule's state `S` `[H_v, D_k, D_v]` (float32, as transformers keeps it).

Both live here in preallocated `[S, ...]` buffers, one row per engine slot, in the slot order of
`SlotKVCache` (active rows `0..n-1`; a finished row is replaced by the last active one, `move_row`).
`hf_layer` wraps a layer's rows in a `transformers` `LinearAttentionLayer` whose state tensors are views
of these buffers, so transformers' own GDN forward (its causal conv1d and gated-delta-rule functions)
reads and writes each slot's state in place:

* a prefill (`fresh=True`: no past tokens) starts from zero state: the layer's chunked kernel
  (`torch_chunk_gated_delta_rule`) runs over the whole left-padded prompt (padding positions are zeroed by
  the recurrent mask, so they leave the state and the convolution window at zero) and its final state and
  last K convolution inputs are copied into the slot rows;
* a decode step (`fresh=False`) runs the recurrent kernel (`torch_recurrent_gated_delta_rule`) and
  `causal_conv1d_update` on the rows' state, one token each.

A weight update between steps leaves the state as it is (computed with the old weights), like the KV cache
(PipelineRL in-flight semantics, paper Sec. 3.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True, kw_only=True)
class RecurrentSpec:
    """Which decoder layers are GDN layers and the sizes of one slot's state in each."""

    layers: tuple[int, ...]
    conv_dim: int
    """Channels of the causal convolution: 2 * key heads * key dim + value heads * value dim."""
    conv_kernel: int
    value_heads: int
    key_dim: int
    value_dim: int


def recurrent_spec(model: Any) -> RecurrentSpec | None:
    """The GDN layout of an HF causal LM, read from its `linear_attn` modules (transformers' Qwen3.5 /
    Qwen3.5-MoE / Qwen3-Next `GatedDeltaNet`); None when it has none."""
    layers = getattr(getattr(model, "model", model), "layers", [])
    gdn = [(i, layer.linear_attn) for i, layer in enumerate(layers) if getattr(layer, "linear_attn", None) is not None]
    if not gdn:
        return None
    m = gdn[0][1]  # one config: every GDN layer has the same sizes
    return RecurrentSpec(layers=tuple(i for i, _ in gdn), conv_dim=m.conv_dim, conv_kernel=m.conv_kernel_size,
                         value_heads=m.num_v_heads, key_dim=m.head_k_dim, value_dim=m.head_v_dim)


def _make_layer_class():
    from transformers.cache_utils import LinearAttentionLayer

    class _SlotStateLayer(LinearAttentionLayer):
        """transformers' linear-attention cache layer over views of the slot buffers (written in place)."""

        def __init__(self, conv_view, state_view, *, fresh: bool):
            super().__init__(number_of_states=1)
            self.dtype, self.device = conv_view.dtype, conv_view.device
            self.conv_states[0], self.recurrent_states[0] = conv_view, state_view
            self.conv_kernel_size[0] = conv_view.shape[-1]
            self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = True
            self.has_previous_state[0] = not fresh

    return _SlotStateLayer


class SlotRecurrentState:
    """The conv windows and delta-rule states of every GDN layer, one row per slot (see module doc)."""

    def __init__(self, spec: RecurrentSpec, *, num_slots: int, dtype: "torch.dtype",
                 device: "torch.device | str" = "cpu") -> None:
        import torch

        self.spec = spec
        self.conv = {i: torch.zeros((num_slots, spec.conv_dim, spec.conv_kernel), dtype=dtype, device=device)
                     for i in spec.layers}
        self.state = {i: torch.zeros((num_slots, spec.value_heads, spec.key_dim, spec.value_dim),
                                     dtype=torch.float32, device=device) for i in spec.layers}
        self._layer_cls = _make_layer_class()

    def hf_layer(self, layer: int, rows: slice, *, fresh: bool):
        """The transformers cache layer of GDN layer `layer` over slot rows `rows`; `fresh`: a prefill
        (no past tokens: zero initial state, the chunked kernel), else a decode step on the rows' state."""
        return self._layer_cls(self.conv[layer][rows], self.state[layer][rows], fresh=fresh)

    def move_row(self, src: int, dst: int) -> None:
        """Copy slot `src`'s state into slot `dst`."""
        for buf in (*self.conv.values(), *self.state.values()):
            buf[dst].copy_(buf[src])
