"""The optimizer state around a checkpoint load (`checkpoint.load_checkpoint`): which optimizer Megatron built
(distributed, torch Adam(W) or TE's FusedAdam), priming a never-stepped torch Adam(W) so that Megatron can build the
state dict to load into, restoring Adam's per-parameter steps after a distributed-optimizer load, and the scoped fix for loading a
fully_reshardable distributed-optimizer state (megatron-core 0.16.1)."""

from __future__ import annotations

import contextlib


def is_distributed(optimizer) -> bool:
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return any(type(o).__name__ == "DistributedOptimizer" for o in subs)


@contextlib.contextmanager
def adam_step_kept(optimizer):
    """Scoped fix for loading a `fully_reshardable` distributed-optimizer state (megatron-core 0.16.1).

    `DistributedOptimizer.load_parameter_state_from_fully_reshardable` leaves torch Adam's per-parameter
    'step' out of the tensors it hands to `_set_main_param_and_optimizer_states` (the step comes from
    the saved param_groups and `load_state_dict` has just set it), but that method copies every key of
    the parameter's optimizer state, 'step' included, and fails with KeyError 'step'. While loading,
    each instance's method is wrapped to pass the parameter's own (already restored) step along.
    """
    patched = []
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        orig = getattr(sub, "_set_main_param_and_optimizer_states", None)
        if orig is None:
            continue

        def fixed(model_param, tensors, _orig=orig, _sub=sub):
            group, order = _sub.model_param_group_index_map[model_param]
            state = _sub.optimizer.state.get(_sub.optimizer.param_groups[group]["params"][order], {})
            if "step" in state and "step" not in tensors:
                tensors = {**tensors, "step": state["step"]}
            return _orig(model_param, tensors)

        sub._set_main_param_and_optimizer_states = fixed  # instance attribute: shadows the method
        patched.append(sub)
    try:
        yield
    finally:
        for sub in patched:
            del sub._set_main_param_and_optimizer_states


def optimizer_is_fresh(optimizer) -> bool:
    """True when no (chained) torch optimizer under the Megatron wrapper holds any state yet."""
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return all(len(getattr(getattr(o, "optimizer", o), "state", {})) == 0 for o in subs)


def keeps_per_param_step(inner) -> bool:
    """True for torch's Adam/AdamW, which keep a per-parameter 'step' tensor in their state.

    Megatron's inner optimizer is torch's only without TransformerEngine and Apex
    (megatron/core/optimizer/__init__.py imports `transformer_engine.pytorch.optimizers.FusedAdam`
    first). TE's FusedAdam keeps one 'step' per param group, and its `state_dict()` /
    `load_state_dict()` map every per-parameter state key through `name_to_dtype_map`, which has
    only 'exp_avg', 'exp_avg_sq' and 'master_param': a per-parameter 'step' is a KeyError there.
    """
    import torch

    return isinstance(inner, (torch.optim.Adam, torch.optim.AdamW))


def prime_fresh_optimizer(optimizer) -> bool:
    """Give a never-stepped torch Adam(W) zero moments and step 0 before loading into it.

    Megatron builds the state dict to load into from the optimizer's current state, and the
    distributed optimizer with torch's Adam asserts one common 'step' over it
    (`DistributedOptimizer.state_dict`: `assert len(steps) == 1`), which fails when there is no state
    yet. The load overwrites all of it. Any other inner optimizer (TE/Apex FusedAdam on GPU) is left
    as it is: Megatron reads its step from the param groups and allocates its state while loading
    (`DistributedOptimizer.load_state_dict`), and a primed per-parameter 'step' would break it
    (`keeps_per_param_step`).
    """
    import torch

    primed = False
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner, init = getattr(sub, "optimizer", None), getattr(sub, "init_state_fn", None)
        if inner is None or init is None or len(inner.state) or not keeps_per_param_step(inner):
            continue
        init(inner, sub.config)
        for st in inner.state.values():
            st.setdefault("step", torch.tensor(0.0))
        primed = True
    return primed


def restore_adam_step(optimizer) -> None:
    """After a distributed-optimizer load into torch Adam(W): give every parameter its own 'step' tensor holding
    the saved common step.

    Without TransformerEngine/Apex, `DistributedOptimizer.load_state_dict` (megatron-core 0.16.1) puts the saved
    common step (the 'step' of the saved param_groups, which it also copies into the inner optimizer's
    param_groups) into the state as ONE tensor object shared by every parameter. Torch's Adam increments each
    parameter's step in place, so the next `step()` advanced that shared counter once per parameter and the bias
    correction of Adam (1 - beta^t) used t = s+1, s+2, ... instead of s+1. The dp_reshardable load then copies
    the *local* (non-persistent) step into it: 0 for a primed fresh optimizer, the in-memory step for a load
    into a trained one. Both are undone here, per chained optimizer (the expert-parallel one is separate).
    Other inner optimizers (TE/Apex FusedAdam: no per-parameter step) and non-distributed ones (their param
    groups hold no 'step') are left as they are.
    """
    import torch

    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(sub, "optimizer", None)
        if inner is None or not keeps_per_param_step(inner):
            continue
        steps = {float(g["step"]) for g in inner.param_groups if "step" in g and g["params"]}
        if len(steps) != 1:
            continue
        step = steps.pop()
        for st in inner.state.values():
            if "step" in st:
                st["step"] = torch.tensor(step, dtype=torch.float32)
