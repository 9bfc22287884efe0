"""A Gated DeltaNet hybrid's layers in the planner (`cluster.plan.ModelShape.gdn`): which layers are GDN, what one
GDN mixer holds, how Megatron splits it over tensor parallelism, and the state a generator keeps per sequence.

Megatron's `GatedDeltaNet` (the local spec of trainer/megatron/gdn.py) on TP `t` splits by key / value heads, so each
rank holds `1/t` of: in_proj (a ColumnParallelLinear: q, k, v, z, b, a), the depthwise conv1d over q/k/v, A_log and
dt_bias (one per value head) and out_proj (a RowParallelLinear). The gated output norm's weight
`[linear_value_head_dim]` is one per-head weight every TP rank keeps whole (trainer/megatron/gdn.py
`gated_rms_norm`): the mixer's one replicated parameter. A GDN layer has no q/k norms; its input and pre-MLP norms
(`2 * hidden`, replicated) are the layer's. The other layers are gated full attention (`ModelShape.attention_params`,
with the q/k norms of `ModelShape.norm_params_per_layer`).

A hybrid's layer kinds are not uniform over pipeline stages (Qwen3.5-35B-A3B's 40 layers on 4 stages: layers 10-19
hold three full-attention layers, layers 0-9 two), so a stage's parameters count its own layers (`count`).
"""

from __future__ import annotations

from dataclasses import dataclass

Shape = tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class GDNShape:
    """The GDN side of a hybrid (dry_run.model_shape derives it from a ModelConfig, model/hybrid.py's sizes)."""

    layers: tuple[int, ...]  # 0-based GDN layers; the others gated full attention
    mixer: int  # parameters of one GDN mixer (model/hybrid.py gdn_params)
    replicated: int  # of which every TP rank holds whole: the gated output norm's weight [linear_value_head_dim]
    state_bytes: int  # a generator's recurrent + conv state of one sequence over all GDN layers
    fp8_linears: tuple[Shape, ...]  # one mixer's HF projections FP8 weight sync quantizes, [out, in]
    # (cluster/weight_bytes.py counts their blocks); the mixer's other parameters travel in the model's dtype

    def count(self, layers: range) -> int:
        """How many of `layers` (0-based) are GDN layers."""
        return sum(1 for i in layers if i in self.layers)

    def mixer_params(self, layers: range, *, hidden: int) -> tuple[int, int]:
        """(split over TP, replicated) parameters of the GDN layers among `layers`: their mixers, and their input
        and pre-MLP norms (replicated)."""
        n = self.count(layers)
        return n * (self.mixer - self.replicated), n * (2 * hidden + self.replicated)


# Qwen3-Next-80B-A3B (conf/model/qwen3_next_80b_a3b.yaml): every 4th of 48 layers full attention, the other 36 GDN of
# 16 key heads and 32 value heads of 128, conv kernel 4, hidden 2048. One mixer: in_proj 2048 * (2*2048 + 2*4096 +
# 2*32) + conv 8192 * 4 + A_log, dt_bias 2 * 32 + norm 128 + out_proj 4096 * 2048 = 33,718,464 parameters. State per
# sequence: 36 * (32 * 128 * 128 FP32 + 8192 * 3 bf16 conv inputs) = 77,266,944 bytes. FP8 sync quantizes in_proj_qkvz
# [12288, 2048] and out_proj [2048, 4096]; in_proj_ba [64, 2048] stays bf16 (quant/fp8.py). dry_run.model_shape of the
# preset gives the same shape (tests/unit/test_plan_gdn.py).
QWEN3_NEXT_GDN = GDNShape(layers=tuple(i for i in range(48) if (i + 1) % 4), mixer=33_718_464, replicated=128,
                          state_bytes=77_266_944, fp8_linears=((12288, 2048), (2048, 4096)))
