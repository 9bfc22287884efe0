"""The `peft` group: parameter-efficient RL, LoRA adapters on the trainer's linear layers (Hu et al. 2021), and its
checks. `peft=none` (the default) trains every weight; `peft=lora` freezes the base model and trains low-rank
adapters `W x + (alpha / r) B A x` only, so the optimizer keeps state for the adapters alone and a weight push can
carry the adapters instead of the model.

Target names are Megatron-Core's linear layers (q/k/v and gate/up are fused there), each matching its modules in
every architecture that has them (docs/running_scalerl.md "LoRA"):

    linear_qkv                  attention q, k, v (one fused linear; HF q_proj, k_proj, v_proj)
    linear_proj                 attention output (HF o_proj)
    linear_fc1                  every SwiGLU gate/up: dense MLP, routed experts, shared expert (HF gate_proj, up_proj)
    linear_fc2                  every SwiGLU down: dense MLP, routed experts, shared expert (HF down_proj)
    mlp.linear_fc1/fc2          the dense MLP only (the dense layers of an MoE model included)
    experts.linear_fc1/fc2      the routed experts only (one adapter per expert)
    shared_experts.linear_fc1/fc2  the shared expert only (Llama-4 Scout)

Pure dataclass and checks: no torch, no megatron (the config layer is imported before anything is built).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from scalerl_mega.config.checks import one_of, positive
from scalerl_mega.suggest import did_you_mean

PEFT_KINDS = ("none", "lora")
TARGET_KINDS: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("qkv",),
    "linear_proj": ("proj",),
    "linear_fc1": ("fc1", "expert_fc1", "shared_fc1"),
    "linear_fc2": ("fc2", "expert_fc2", "shared_fc2"),
    "mlp.linear_fc1": ("fc1",),
    "mlp.linear_fc2": ("fc2",),
    "experts.linear_fc1": ("expert_fc1",),
    "experts.linear_fc2": ("expert_fc2",),
    "shared_experts.linear_fc1": ("shared_fc1",),
    "shared_experts.linear_fc2": ("shared_fc2",),
}
"""Target name -> the module kinds it adapts (`trainer.megatron.lora.module_kind` classifies a model's linears)."""
DEFAULT_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
NOT_OFFERED = {
    "use_rslora": "rsLoRA (scale alpha/sqrt(r)): SGLang 0.5.23 ignores use_rslora and would serve the adapter "
                  "mis-scaled by sqrt(r)",
    "use_dora": "DoRA: SGLang 0.5.23 refuses DoRA adapters",
}


@dataclass(kw_only=True)
class PeftConfig:
    """LoRA on the trainer's linears (`peft.kind=lora`); `none` trains the full model."""

    kind: str = "none"
    """none | lora."""
    rank: int = 8
    """r: the adapters' inner width (A is [r, in], B is [out, r])."""
    alpha: float = 16.0
    """The adapter's output is scaled by alpha / r (PEFT's `lora_alpha`; rsLoRA's alpha / sqrt(r) is not offered)."""
    dropout: float = 0.0
    """Dropout on the adapter's input in training steps (PEFT's `lora_dropout`); log-probs and the generators
    run without it. Only with tensor parallelism 1 (the replicated A of a column-parallel layer would need the
    same mask on every tensor-parallel rank)."""
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    """Which linears get adapters (module docstring; docs/running_scalerl.md "LoRA"). A name that matches no
    module of the model (experts on a dense model) adapts nothing there."""

    @property
    def on(self) -> bool:
        return self.kind == "lora"


def target_kinds(targets: list[str]) -> set[str]:
    """The module kinds (`TARGET_KINDS` values) the target names select."""
    return {k for t in targets for k in TARGET_KINDS[t]}


def validate_peft(peft: PeftConfig) -> None:
    """`peft.*` on its own; what depends on the model and layout is `validate_peft_for`."""
    one_of("peft.kind", peft.kind, PEFT_KINDS)
    if not peft.on:
        return
    if isinstance(peft.rank, bool) or not isinstance(peft.rank, int):
        raise ValueError(f"peft.rank={peft.rank!r} must be a positive integer")
    positive("peft.rank", peft.rank)
    positive("peft.alpha", float(peft.alpha))
    if not 0.0 <= float(peft.dropout) < 1.0:
        raise ValueError(f"peft.dropout={peft.dropout!r} must be in [0, 1)")
    targets = list(peft.targets)
    if not targets:
        raise ValueError("peft.targets=[] adapts nothing; name at least one of " + str(list(TARGET_KINDS)))
    for name in targets:
        if name in NOT_OFFERED:
            raise ValueError(f"peft.targets: {name!r} is not a target, and {NOT_OFFERED[name]}: not offered")
        if name not in TARGET_KINDS:
            raise ValueError(f"peft.targets: unknown target {name!r}{did_you_mean(name, TARGET_KINDS)}; known: "
                             f"{list(TARGET_KINDS)}")
    if len(set(targets)) != len(targets):
        raise ValueError(f"peft.targets={targets!r} names a target twice")


def validate_peft_for(peft: PeftConfig, *, arch: str, is_mla: bool, is_moe: bool, tp: int, expert_tp: int) -> None:
    """`peft=lora` against the model (`model.arch`, MLA, MoE) and layout (`parallel.tp`, the resolved expert tensor
    parallelism): what the trainer's adapters cannot do is refused here, naming the keys, before anything is built."""
    validate_peft(peft)
    if not peft.on:
        return
    if is_mla:
        raise ValueError(f"peft.kind=lora with model.arch={arch!r}: LoRA on Multi-head Latent Attention "
                         "(DeepSeek-V3, Moonlight) is deferred (its low-rank q/kv projections have no adapter "
                         "mapping or PEFT export yet); use peft=none")
    if float(peft.dropout) > 0 and tp > 1:
        raise ValueError(f"peft.dropout={peft.dropout} with parallel.tp={tp}: the adapter A of a "
                         "column-parallel layer is replicated over tensor-parallel ranks and would need one "
                         "dropout mask on all of them; use peft.dropout=0 or parallel.tp=1")
    experts = target_kinds(list(peft.targets)) & {"expert_fc1", "expert_fc2"}
    if experts and is_moe and expert_tp > 1:
        raise ValueError(f"peft.targets={list(peft.targets)!r} adapts the routed experts with expert tensor "
                         f"parallelism {expert_tp} (parallel.etp; with parallel.ep=1 it is parallel.tp): "
                         "expert adapters are implemented for whole experts per rank; use parallel.ep > 1 with "
                         "parallel.etp=1, or targets without the experts (linear_qkv, linear_proj, mlp.linear_fc1, "
                         "mlp.linear_fc2)")
