"""Sparse expert dispatch for the engine's HF Llama-4 MoE layers.

HF's `Llama4TextMoe` runs every token through every routed expert: it repeats the hidden states once
per expert, scales each copy by that expert's router score (0 for the experts not in the token's
top-k) and multiplies all of them (`Llama4TextExperts`: one `bmm` over experts). For the tokens an
expert did not select its input is 0 and so is its output, which the sum over experts then adds. The
dispatch here computes the same sum over the selected experts only: each expert multiplies the rows
that chose it (input scaled by the score, as Llama-4 does, before the expert), and the routed outputs
are summed before the shared expert's output is added, as in HF. The router module still runs (its
forward hooks, e.g. the engine's route recording, see the same outputs).

Same maths; the floating-point result differs from HF's only in matmul blocking (tested against the
dense module in float64 and float32). On the reproduction sweep's model (4 experts, top-1) it skips
3/4 of the expert arithmetic of every decode step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch


def sparse_moe_forward(moe: "torch.nn.Module", hidden_states: "torch.Tensor"):
    """`Llama4TextMoe.forward` with the routed experts computed on their own tokens only.
    Returns (output [N, H], router logits [N, E]) like HF's."""
    import torch

    h_NH = hidden_states.reshape(-1, moe.hidden_dim)
    scores_NE, logits_NE = moe.router(h_NH)
    experts = moe.experts
    ids_NK = torch.topk(logits_NE, moe.top_k, dim=1).indices  # the router's own selection
    routed_NH = torch.zeros_like(h_NH)
    lora = getattr(experts, LORA_ATTR, None)  # per-expert LoRA adapters (rollout/lora.py), if any are served
    for e in torch.unique(ids_NK).tolist():
        rows = (ids_NK == e).any(dim=1).nonzero().squeeze(1)
        x = h_NH.index_select(0, rows) * scores_NE.index_select(0, rows)[:, e : e + 1]
        gate, up = (x @ experts.gate_up_proj[e]).chunk(2, dim=-1)
        if lora is not None:
            gate, up = lora.expert_delta(experts, e, rows=rows, x=x, outs=(gate, up), projs=("gate_proj", "up_proj"),
                                         n_tokens=h_NH.shape[0])
        h = up * experts.act_fn(gate)
        out = h @ experts.down_proj[e]
        if lora is not None:
            (out,) = lora.expert_delta(experts, e, rows=rows, x=h, outs=(out,), projs=("down_proj",),
                                       n_tokens=h_NH.shape[0])
        routed_NH.index_add_(0, rows, out)
    out = moe.shared_expert(h_NH)
    out.add_(routed_NH)
    return out, logits_NE


LORA_ATTR = "_scalerl_lora"
"""Attribute of a sparse layer's `Llama4TextExperts` holding the `lora.MultiLoRA` that serves adapters on its experts
(set by `MultiLoRA.add`)."""
SPARSE_ATTR = "_scalerl_sparse"
"""Marks a `Llama4TextMoe` routed through `sparse_moe_forward` (its experts can take LoRA adapters)."""


def use_sparse_moe(model: "torch.nn.Module") -> int:
    """Route every HF `Llama4TextMoe` of `model` through `sparse_moe_forward` (in place, on this
    model's module instances only). Returns how many layers were switched (0 for a dense model)."""
    import types

    n = 0
    for module in model.modules():
        if type(module).__name__ == "Llama4TextMoe":
            module.forward = types.MethodType(sparse_moe_forward, module)
            setattr(module, SPARSE_ATTR, True)
            n += 1
    return n
