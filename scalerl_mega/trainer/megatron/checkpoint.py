"""Atomic Megatron dist-checkpointing of model + optimizer + extra (RL) state.

Layout under a checkpoint root:
    step_00000012/      complete checkpoints (Megatron torch_dist files + model_config.json
                        + COMPLETE marker)
    latest              text file naming the newest complete checkpoint directory
    .tmp-step_00000013/ an in-progress (or crashed) save; never loaded

A save writes into `.tmp-*`, then rank 0 writes the COMPLETE marker, renames the directory into
place and replaces `latest` with os.replace. A crash at any point leaves `latest` naming the
previous complete checkpoint. Model tensors are ShardedTensors, so a checkpoint loads under any
TP/PP/EP layout; the distributed optimizer uses the `dp_reshardable` sharding type (and is
loaded under torch.no_grad(), because its FP32 main params are views of leaf tensors).

Sidecar `model_config.json` (format `scalerl-mega/model-config/1`): the trainer `ModelConfig` of
the saved model, so a checkpoint can be rebuilt without the training config (e.g. by
`tools/convert_megatron_to_hf.py`). Written by rank 0 into `.tmp-*` before the COMPLETE marker,
i.e. inside the atomic rename; `MegatronPolicyTrainer.save` always passes its config. Read it with
`read_model_config`.

Note: Megatron's save starts a spawn-based multiprocessing Manager, so entry scripts need an
`if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

COMPLETE = "COMPLETE"
MODEL_CONFIG = "model_config.json"
MODEL_CONFIG_FORMAT = "scalerl-mega/model-config/1"
LATEST = "latest"
OPTIM_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def step_dirname(step: int) -> str:
    return f"step_{step:08d}"


def _unwrap(chunk):
    return getattr(chunk, "module", chunk)


def _model_sharded_state_dict(chunks: list) -> dict:
    if len(chunks) == 1:
        return _unwrap(chunks[0]).sharded_state_dict()
    raise NotImplementedError("virtual pipeline (several model chunks) checkpointing is not supported yet")


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(root: str | os.PathLike, *, step: int, chunks: list, optimizer=None,
                    extra_state: Optional[dict[str, Any]] = None, model_config=None) -> Path:
    """Collectively save model (+ optimizer) + `extra_state` (picklable, from rank 0) as step `step`.

    `model_config`: the trainer `ModelConfig` recorded in the `model_config.json` sidecar (None: no
    sidecar; such a checkpoint cannot be converted to HF without its config).

    Returns the final directory. On any error the partial `.tmp-*` directory is removed (best
    effort) and the error re-raised; `latest` is untouched.
    """
    from megatron.core import dist_checkpointing

    root = Path(root)
    final = root / step_dirname(step)
    tmp = root / f".tmp-{step_dirname(step)}"
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    sidecar = _model_config_json(model_config)
    model_sd = _model_sharded_state_dict(chunks)
    # An optimizer that has not stepped yet has no moments: Megatron would save none and then fail to
    # load ("optimizer.state.exp_avg... not in state dict"). Record it as fresh instead.
    fresh = optimizer is not None and _optimizer_is_fresh(optimizer)
    state: dict[str, Any] = {"model": model_sd, "extra_state": dict(extra_state or {}),
                             "has_optimizer": optimizer is not None and not fresh, "optimizer_fresh": fresh}
    if state["has_optimizer"]:
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=False, metadata=OPTIM_METADATA)
    try:
        dist_checkpointing.save(state, str(tmp), validate_access_integrity=True)
    except BaseException:
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _barrier()
    if _rank() == 0:
        if sidecar is not None:
            _write_atomic(tmp / MODEL_CONFIG, sidecar)
        _write_atomic(tmp / COMPLETE, json.dumps({"step": step}))
        if final.exists():  # re-saving the same step: move the old one aside first
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
        _write_atomic(root / LATEST, final.name)
    _barrier()
    return final


def _optimizer_is_fresh(optimizer) -> bool:
    """True when no (chained) torch optimizer under the Megatron wrapper holds any state yet."""
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return all(len(getattr(getattr(o, "optimizer", o), "state", {})) == 0 for o in subs)


def _prime_fresh_optimizer(optimizer) -> bool:
    """Give a never-stepped optimizer zero Adam moments and step 0 before loading into it.

    Megatron builds the state dict to load into from the optimizer's current state, and the
    distributed optimizer with torch's Adam asserts one common 'step' over it
    (`DistributedOptimizer.state_dict`: `assert len(steps) == 1`), which fails when there is no state
    yet. The load overwrites all of it.
    """
    import torch

    primed = False
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner, init = getattr(sub, "optimizer", None), getattr(sub, "init_state_fn", None)
        if inner is None or init is None or len(inner.state):
            continue
        init(inner, sub.config)
        for st in inner.state.values():
            st.setdefault("step", torch.tensor(0.0))
        primed = True
    return primed


def _restore_adam_step(optimizer, loaded: Any) -> None:
    """After loading into a primed optimizer: the distributed optimizer's dp_reshardable load copies
    each parameter's 'step' from the *local* (non-persistent) value, i.e. the 0 of the priming, so
    Adam's bias correction would restart. Set every state's step to the saved common step (the
    'step' of the saved param_groups)."""
    import torch

    steps: set[float] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for group in node.get("param_groups", []) if isinstance(node.get("param_groups"), list) else []:
                if isinstance(group, dict) and "step" in group:
                    steps.add(float(group["step"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(loaded)
    if len(steps) != 1:
        return
    step = steps.pop()
    for sub in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        for st in getattr(getattr(sub, "optimizer", None), "state", {}).values():
            if "step" in st:
                st["step"] = torch.tensor(step, dtype=torch.float32)


def _model_config_json(model_config) -> Optional[str]:
    """Sidecar text for `model_config` (None: no sidecar)."""
    import dataclasses

    if model_config is None:
        return None
    return json.dumps({"format": MODEL_CONFIG_FORMAT, "source": "given",
                       "model": dataclasses.asdict(model_config)}, indent=1)


def read_model_config(path: str | os.PathLike):
    """The `ModelConfig` recorded with a checkpoint (directory or root with `latest`)."""
    from scalerl_mega.trainer.megatron.config import model_from_dict

    ckpt = resolve(path)
    side = ckpt / MODEL_CONFIG
    if not side.is_file():
        raise ValueError(f"checkpoint {ckpt}: {MODEL_CONFIG} is missing (saved before the model config was "
                         "recorded with checkpoints); the model shape is unknown")
    try:
        data = json.loads(side.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{side}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != MODEL_CONFIG_FORMAT or not isinstance(data.get("model"), dict):
        raise ValueError(f"{side}: format={data.get('format') if isinstance(data, dict) else None!r}, "
                         f"expected {MODEL_CONFIG_FORMAT!r} with a 'model' mapping")
    return model_from_dict(data["model"], source=str(side)).validate()


def resolve(path: str | os.PathLike) -> Path:
    """A checkpoint directory from either itself or a root holding `latest`. Only complete ones."""
    path = Path(path)
    if (path / LATEST).is_file():
        name = (path / LATEST).read_text().strip()
        path = path / name
    if not (path / COMPLETE).is_file():
        raise ValueError(f"checkpoint {path}: not a complete checkpoint (no {COMPLETE} marker)")
    return path


def latest_step(root: str | os.PathLike) -> Optional[int]:
    """Step of the checkpoint `latest` points to, or None when there is none."""
    try:
        path = resolve(root)
    except ValueError:
        return None
    return int(json.loads((path / COMPLETE).read_text())["step"])


def load_checkpoint(path: str | os.PathLike, *, chunks: list, optimizer=None,
                    load_optimizer: bool = True) -> dict[str, Any]:
    """Collectively load into `chunks` (any TP/PP/EP layout) and, if given, `optimizer`.

    Returns the extra state saved with the checkpoint.
    """
    import torch
    from megatron.core import dist_checkpointing

    ckpt = resolve(path)
    common = dist_checkpointing.load_common_state_dict(str(ckpt))
    model_sd = _model_sharded_state_dict(chunks)
    state: dict[str, Any] = {"model": model_sd}
    with_opt = optimizer is not None and load_optimizer and not common.get("optimizer_fresh", False)
    if with_opt:
        if not common.get("has_optimizer", False):
            raise ValueError(f"checkpoint {ckpt}: has no optimizer state (saved with optimizer=None)")
        primed = _prime_fresh_optimizer(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=True, metadata=OPTIM_METADATA)
    loaded = dist_checkpointing.load(state, str(ckpt))
    _unwrap(chunks[0]).load_state_dict(loaded["model"])
    if with_opt:
        with torch.no_grad():
            optimizer.load_state_dict(loaded["optimizer"])
            if primed:
                _restore_adam_step(optimizer, loaded["optimizer"])
    return dict(common.get("extra_state", {}))
