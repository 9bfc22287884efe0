"""Llama-3-style RoPE frequency scaling with all four Hugging Face parameters.

Megatron-Core 0.16.1 (``RotaryEmbedding``) exposes only the factor and fixes the other three
(low 1, high 4, original context 8192), which is Llama-3.1's setting but not Llama-4 Scout's
(factor 16, low = high = 1, original 8192). ``build_model`` therefore builds the model without
Megatron's scaling and installs ``llama3_inv_freq`` on its ``RotaryEmbedding`` (``apply_rope_scaling``).

Per frequency with wavelength ``w = 2*pi / f`` and ``L = original_max_position_embeddings``:
``w > L / low`` -> ``f / factor``; ``w < L / high`` -> ``f``; in between (only when high > low) the
linear blend ``(1 - t) * f / factor + t * f`` with ``t = (L / w - low) / (high - low)``.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True, kw_only=True)
class Llama3RopeScaling:
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def validate(self, where: str) -> "Llama3RopeScaling":
        if self.factor <= 0 or self.low_freq_factor <= 0 or self.original_max_position_embeddings <= 0:
            raise ValueError(f"{where}: RoPE scaling factor={self.factor}, low_freq_factor={self.low_freq_factor} and "
                             f"original_max_position_embeddings={self.original_max_position_embeddings} must be > 0")
        if self.high_freq_factor < self.low_freq_factor:
            raise ValueError(f"{where}: rope high_freq_factor={self.high_freq_factor} < low_freq_factor={self.low_freq_factor}")
        return self


def scaling_of(model_cfg) -> Llama3RopeScaling | None:
    """The RoPE scaling of a trainer ``ModelConfig`` (None when ``rope_scaling`` is off)."""
    if not model_cfg.rope_scaling:
        return None
    return Llama3RopeScaling(factor=float(model_cfg.rope_scaling_factor),
                             low_freq_factor=float(model_cfg.rope_low_freq_factor),
                             high_freq_factor=float(model_cfg.rope_high_freq_factor),
                             original_max_position_embeddings=int(model_cfg.rope_original_max_position_embeddings))


def llama3_inv_freq(inv_freq, scaling: Llama3RopeScaling):
    """Scaled inverse frequencies (same dtype/device as ``inv_freq``, the unscaled ones)."""
    import torch

    ctx, low, high = scaling.original_max_position_embeddings, scaling.low_freq_factor, scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    out = torch.where(wavelen > ctx / low, inv_freq / scaling.factor, inv_freq)
    if high > low:
        t = (ctx / wavelen - low) / (high - low)
        blend = (1 - t) * inv_freq / scaling.factor + t * inv_freq
        between = (wavelen >= ctx / high) & (wavelen <= ctx / low)
        out = torch.where(between, blend, out)
    return out


def apply_rope_scaling(gpt, model_cfg) -> None:
    """Install the scaled frequencies on a ``GPTModel`` built with Megatron's scaling off
    (``rope_scaling=False``); call before the first forward (``RotaryEmbedding.forward`` caches)."""
    scaling = scaling_of(model_cfg)
    rotary = getattr(gpt, "rotary_pos_emb", None)
    if scaling is None or rotary is None:
        return
    rotary.inv_freq = llama3_inv_freq(rotary.inv_freq, scaling)
    rotary.forward.cache_clear()
