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

Integrity: before the COMPLETE marker, the ranks hash every file of the checkpoint in
parallel and rank 0 records `checksums.json` (size + sha256 per file). `load_checkpoint` on a root
first deletes leftover `.tmp-*` directories (saves killed midway, e.g. during the very first save),
then tries the checkpoint `latest` names and, if that one fails verification (a file missing,
truncated or altered, e.g. a bit flip in a tensor file or a deleted `common.pt`), logs an error
naming it and falls back to the next-newest complete checkpoint that verifies -- so a damaged
`latest` costs the steps since the previous save, not the run. If none verifies, ValueError names
every checkpoint tried and why. Load failures of a checkpoint that verified are not damage (e.g. a
model shape that does not match) and are raised naming the checkpoint, without fallback. A
checkpoint directory given explicitly (not a root) is verified and never substituted. A failed save
(any error, including ENOSPC) removes its `.tmp-*` directory and leaves `latest` and every earlier
checkpoint untouched. Retention (`prune_checkpoints`, `train.keep_checkpoints`) keeps the newest N
complete checkpoints and never the one `latest` names.

Optimizer formats (`optim.checkpoint_format`, recorded in the common state, so a load always uses the
format the checkpoint was written in): `dp_reshardable` (default) writes the distributed optimizer's
flat buffers as they are -- fully parallel, no gather -- and reshards over DP only; loading it under
another TP/PP/EP layout raises ValueError naming the key. `fully_reshardable` gathers the state on
each data-parallel rank 0 (gloo) into model space: per parameter, FP32 main weight and Adam moments
shaped and sharded like the parameter itself, so it loads under any TP/PP/EP/DP layout (dist-
checkpointing reshards it with the model); the cost is that gather at save time, and each rank
reading its whole TP/PP shard of the state (not only its DP slice) at load time. Non-distributed
optimizers keep their state in model space in either format, but not the distributed optimizer's: state
written by one kind is refused by the other, naming `optim.use_distributed_optimizer` (its default follows the
data-parallel size, so a resume from DP 2 onto one rank changes the kind). megatron-core 0.16.1 cannot load
`fully_reshardable` with torch Adam (KeyError 'step'); `optimizer_state.adam_step_kept` is the scoped fix.

Note: Megatron's save starts a spawn-based multiprocessing Manager, so entry scripts need an
`if __name__ == "__main__":` guard.

Preemption (scalerl_mega/preemption.py): the save runs under `preemption.shielded()`, so the writer
processes Megatron forks for it ignore a SIGTERM sent to the whole step or process group (the
trainer decides when to stop, after the save), and Megatron's results-queue manager -- a server
process that lives as long as the trainer -- is started here with `preemption.child_setup` as its
initializer: it ignores that SIGTERM too and exits when the trainer is gone, even after `kill -9`
(Megatron's own would run forever).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

from scalerl_mega.preemption import child_setup, shielded
from scalerl_mega.trainer.megatron import optimizer_state

COMPLETE = "COMPLETE"
MODEL_CONFIG = "model_config.json"
MODEL_CONFIG_FORMAT = "scalerl-mega/model-config/1"
LATEST = "latest"
CHECKSUMS = "checksums.json"
CHECKSUMS_FORMAT = "scalerl-mega/checksums/1"
TMP_PREFIX = ".tmp-"

log = logging.getLogger(__name__)
OPTIM_FORMATS = ("dp_reshardable", "fully_reshardable")
"""How the distributed optimizer's state is written (`optim.checkpoint_format`; module doc)."""


def optim_metadata(fmt: str) -> dict[str, Any]:
    """Megatron `sharded_state_dict` metadata for optimizer format `fmt`. fully_reshardable gathers with
    gloo onto data-parallel rank 0 (the "mem_efficient" variant: its all-ranks variant gathers over
    NCCL, i.e. needs CUDA, and holds the whole state on every rank)."""
    if fmt not in OPTIM_FORMATS:
        raise ValueError(f"optim.checkpoint_format={fmt!r} must be one of {OPTIM_FORMATS}")
    meta: dict[str, Any] = {"distrib_optim_sharding_type": fmt}
    if fmt == "fully_reshardable":
        meta["distrib_optim_fully_reshardable_mem_efficient"] = True
    return meta


def step_dirname(step: int) -> str:
    return f"step_{step:08d}"


def _unwrap(chunk):
    return getattr(chunk, "module", chunk)


def _model_sharded_state_dict(chunks: list) -> dict:
    """The model part of a checkpoint: the whole model's sharded state, or with LoRA adapters (`peft=lora`) the
    adapters' only (the frozen base is referenced, not saved: lora_ckpt.py)."""
    from scalerl_mega.trainer.megatron import lora_ckpt

    if len(chunks) != 1:
        raise NotImplementedError("virtual pipeline (several model chunks) checkpointing is not supported yet")
    if lora_ckpt.has_adapters(chunks):
        return lora_ckpt.adapter_sharded_state_dict(chunks)
    return _unwrap(chunks[0]).sharded_state_dict()


def _load_model_state(chunks: list, loaded: dict) -> None:
    from scalerl_mega.trainer.megatron import lora_ckpt

    if lora_ckpt.has_adapters(chunks):
        lora_ckpt.load_adapter_state(chunks, loaded)
    else:
        _unwrap(chunks[0]).load_state_dict(loaded)


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
                    extra_state: Optional[dict[str, Any]] = None, model_config=None,
                    optimizer_format: str = "dp_reshardable") -> Path:
    """Collectively save model (+ optimizer) + `extra_state` (picklable, from rank 0) as step `step`.

    `model_config`: the trainer `ModelConfig` recorded in the `model_config.json` sidecar (None: no
    sidecar; such a checkpoint cannot be converted to HF without its config). `optimizer_format`:
    `OPTIM_FORMATS` (module doc).

    Returns the final directory. On any error the partial `.tmp-*` directory is removed (best
    effort) and the error re-raised; `latest` is untouched.
    """
    from megatron.core import dist_checkpointing

    root = Path(root)
    final = root / step_dirname(step)
    tmp = root / f"{TMP_PREFIX}{step_dirname(step)}"
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
    fresh = optimizer is not None and optimizer_state.optimizer_is_fresh(optimizer)
    state: dict[str, Any] = {"model": model_sd, "extra_state": dict(extra_state or {}),
                             "has_optimizer": optimizer is not None and not fresh, "optimizer_fresh": fresh,
                             "optimizer_format": optimizer_format, "layout": _layout(),
                             "optimizer_distributed": bool(optimizer is not None
                                                           and optimizer_state.is_distributed(optimizer))}
    if state["has_optimizer"]:
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=False,
                                                          metadata=optim_metadata(optimizer_format))
    try:
        _own_results_queue()
        with shielded():  # Megatron's writer processes leave SIGTERM to this process (module doc)
            dist_checkpointing.save(state, str(tmp), validate_access_integrity=True)
        _barrier()
        if _rank() == 0 and sidecar is not None:
            _write_atomic(tmp / MODEL_CONFIG, sidecar)
        _barrier()
        sums = _hash_files(tmp)  # collective: each rank hashes a share
        if _rank() == 0:
            _write_atomic(tmp / CHECKSUMS, json.dumps({"format": CHECKSUMS_FORMAT, "files": sums}, indent=0))
            _write_atomic(tmp / COMPLETE, json.dumps({"step": step}))
    except BaseException:
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if _rank() == 0:
        if final.exists():  # re-saving the same step: move the old one aside first
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
        _write_atomic(root / LATEST, final.name)
    _barrier()
    return final


_MANAGER: Any = None


def _own_results_queue() -> None:
    """Start the manager behind Megatron's write-results queue (megatron-core 0.16.1:
    `filesystem_async._get_write_results_queue`, created on first use and kept for the process's
    life) ourselves, as a child that ignores the group SIGTERM and exits with this process (module
    doc). A no-op once the queue exists or where Megatron no longer has that global."""
    global _MANAGER
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", False) is not None:
        return
    import multiprocessing as mp
    from multiprocessing.managers import SyncManager

    manager = SyncManager(ctx=mp.get_context("spawn"))
    with shielded():
        manager.start(initializer=functools.partial(child_setup, os.getpid(),
                                                    name="checkpoint results-queue manager"))
    _MANAGER = manager
    filesystem_async._results_queue = manager.Queue()


def _file_digest(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def _dist():
    """torch.distributed when a process group is up, else None (without importing torch when nothing has:
    `loadable_step` runs in the start banner, before the heavy imports)."""
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def _my_share(names: list[str]) -> list[str]:
    dist = _dist()
    if dist is None:
        return names
    return names[dist.get_rank()::dist.get_world_size()]


def _gather(obj: object) -> list[Any]:
    dist = _dist()
    if dist is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _hash_files(ckpt: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {size, sha256}} of every file under `ckpt` but the marker and the checksum file
    itself; the files are split among the ranks and the results gathered (collective)."""
    names = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*")
                   if p.is_file() and p.name not in (COMPLETE, CHECKSUMS) and not p.name.endswith(".tmp"))
    mine = {n: _file_digest(ckpt / n) for n in _my_share(names)}
    return {k: v for part in _gather(mine) for k, v in part.items()}


def verify_checkpoint(ckpt: str | os.PathLike) -> Optional[str]:
    """None if every file recorded in `checksums.json` is present with its size and sha256, else the
    first problem found (collective when torch.distributed is initialized: all ranks get the same
    answer). A checkpoint saved before checksums were recorded only has its COMPLETE marker checked."""
    ckpt = Path(ckpt)
    problem: Optional[str] = None
    if not (ckpt / COMPLETE).is_file():
        problem = f"no {COMPLETE} marker"
    elif (ckpt / CHECKSUMS).is_file():
        try:
            data = json.loads((ckpt / CHECKSUMS).read_text())
            files = data["files"] if data.get("format") == CHECKSUMS_FORMAT else None
        except (ValueError, KeyError, AttributeError, OSError):
            files = None
        if not isinstance(files, dict):
            problem = f"{CHECKSUMS} is unreadable"
        else:
            for name in _my_share(sorted(files)):
                f = ckpt / name
                if not f.is_file():
                    problem = f"{name} is missing"
                elif f.stat().st_size != files[name]["size"]:
                    problem = f"{name} has {f.stat().st_size} bytes, {files[name]['size']} were written"
                elif _file_digest(f)["sha256"] != files[name]["sha256"]:
                    problem = f"{name} does not match its recorded sha256"
                if problem:
                    break
    problems = [p for p in _gather(problem) if p]
    return problems[0] if problems else None


def clean_incomplete(root: str | os.PathLike) -> list[Path]:
    """Delete `.tmp-*` directories (saves that never completed) under checkpoint root `root` (rank 0;
    collective barrier after). Returns what was removed."""
    root = Path(root)
    removed = sorted(p for p in root.glob(f"{TMP_PREFIX}*") if p.is_dir()) if root.is_dir() else []
    if _rank() == 0:
        for p in removed:
            log.warning("checkpoint: removing incomplete save %s", p)
            shutil.rmtree(p, ignore_errors=True)
        for p in root.glob("*.tmp") if root.is_dir() else []:
            p.unlink(missing_ok=True)  # an interrupted `latest` / marker replacement
    _barrier()
    return removed


def _step_of(ckpt: Path) -> int:
    try:
        return int(json.loads((ckpt / COMPLETE).read_text())["step"])
    except (ValueError, KeyError, TypeError, OSError):
        return int(ckpt.name.rsplit("_", 1)[-1]) if ckpt.name.rsplit("_", 1)[-1].isdigit() else -1


def candidates(path: str | os.PathLike) -> list[Path]:
    """Checkpoints to try for `path`, best first: the directory itself when it is one; for a root,
    the one `latest` names, then every other complete `step_*` directory, newest step first."""
    path = Path(path)
    if (path / COMPLETE).is_file() and not (path / LATEST).is_file():
        return [path]
    named = []
    if (path / LATEST).is_file():
        target = path / (path / LATEST).read_text().strip()
        if (target / COMPLETE).is_file():
            named = [target]
    others = sorted((p for p in path.glob("step_*") if (p / COMPLETE).is_file() and p not in named),
                    key=_step_of, reverse=True)
    return named + others


def prune_checkpoints(root: str | os.PathLike, *, keep: int) -> list[Path]:
    """Retention (`train.keep_checkpoints`): delete the complete `step_*` checkpoints under `root`
    beyond the `keep` newest steps; `keep <= 0` keeps all. The checkpoint `latest` names is never
    deleted, and nothing is deleted while `latest` does not name a complete checkpoint (so the last
    good one always survives). Incomplete directories are left to `clean_incomplete`. Call it on one
    rank after a save has completed; returns what was removed. Keep >= 2 to have a fallback when
    `latest` is found damaged on resume (`load_checkpoint`)."""
    root = Path(root)
    if keep <= 0 or not (root / LATEST).is_file():
        return []
    latest = root / (root / LATEST).read_text().strip()
    if not (latest / COMPLETE).is_file():
        log.warning("checkpoint retention skipped: %s names no complete checkpoint", root / LATEST)
        return []
    complete = sorted((p for p in root.glob("step_*") if (p / COMPLETE).is_file()), key=_step_of, reverse=True)
    doomed = [p for p in complete[keep:] if p != latest]
    for p in doomed:
        log.info("checkpoint retention (keep %d): removing %s", keep, p)
        # the marker first: a removal cut short leaves an incomplete directory, never a damaged candidate
        (p / COMPLETE).unlink(missing_ok=True)
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _layout() -> dict[str, int]:
    """The model-parallel layout the state is saved under (what dp_reshardable cannot change)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return {}
    return {"tp": ps.get_tensor_model_parallel_world_size(), "pp": ps.get_pipeline_model_parallel_world_size(),
            "ep": ps.get_expert_model_parallel_world_size(), "etp": ps.get_expert_tensor_parallel_world_size()}


def _model_config_json(model_config) -> Optional[str]:
    """Sidecar text for `model_config` (None: no sidecar)."""
    import dataclasses

    if model_config is None:
        return None
    return json.dumps({"format": MODEL_CONFIG_FORMAT, "source": "given",
                       "model": dataclasses.asdict(model_config)}, indent=1)


def read_model_config(path: str | os.PathLike):
    """The `ModelConfig` recorded with a checkpoint (directory or root with `latest`)."""
    from scalerl_mega.model.config import model_from_dict

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
    """Step of the checkpoint `latest` points to, or None when there is none. Not necessarily the step a
    resume loads (a damaged `latest` falls back): `loadable_step` is that one."""
    try:
        path = resolve(root)
    except ValueError:
        return None
    return int(json.loads((path / COMPLETE).read_text())["step"])


def loadable_step(path: str | os.PathLike) -> Optional[int]:
    """The step `load_checkpoint(path)` will load: that of the first of `candidates(path)` that passes
    `verify_checkpoint` (the load's own check, so a damaged `latest` gives the previous step) and, when it
    was saved without checksums, still holds its common-state file; None when none does. Reads and hashes
    the files, as the load does (collective when torch.distributed is initialized)."""
    from scalerl_mega.trainer.megatron import mcore_compat

    for ckpt in candidates(path):
        if verify_checkpoint(ckpt) is None and ((ckpt / CHECKSUMS).is_file()
                                                or (ckpt / mcore_compat.common_state_file()).is_file()):
            return _step_of(ckpt)
    return None


def load_checkpoint(path: str | os.PathLike, *, chunks: list, optimizer=None,
                    load_optimizer: bool = True) -> dict[str, Any]:
    """Collectively load into `chunks` (any TP/PP/EP layout) and, if given, `optimizer`.

    `path` is a checkpoint directory or a root; for a root, incomplete saves are cleaned and a damaged
    `latest` falls back to the previous complete checkpoint (module docstring). Returns the extra state
    saved with the checkpoint.
    """
    path = Path(path)
    if not (path / COMPLETE).is_file() or (path / LATEST).is_file():
        clean_incomplete(path)
    tried: list[str] = []
    for ckpt in candidates(path):
        problem = verify_checkpoint(ckpt)
        if problem is None:
            try:
                common = _load_common(ckpt)
            except ValueError as exc:
                problem = str(exc)
            else:
                if tried:
                    log.error("checkpoint: loading %s instead (steps after it are lost)", ckpt)
                return _load_verified(ckpt, common, chunks=chunks, optimizer=optimizer, load_optimizer=load_optimizer)
        log.error("checkpoint %s is damaged: %s", ckpt, problem)
        tried.append(f"{ckpt} ({problem})")
    if not tried:
        raise ValueError(f"checkpoint {path}: not a complete checkpoint and holds none (no {COMPLETE} marker)")
    raise ValueError(f"checkpoint {path}: no loadable checkpoint; tried: " + "; ".join(tried))


def _load_common(ckpt: Path) -> dict[str, Any]:
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        return dist_checkpointing.load_common_state_dict(str(ckpt))
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - common state missing/corrupt, no checksums
        raise ValueError(f"common state unreadable ({type(exc).__name__}: {str(exc)[:200]})") from exc


def _check_optimizer_kind(ckpt: Path, saved_distributed: Optional[bool], optimizer) -> None:
    """Refuse optimizer state written by the other kind of optimizer (None: a checkpoint that predates the
    record). The distributed optimizer's state holds FP32 main weights and its own param-group keys, torch
    Adam's does not, so neither loads into the other (Megatron fails on a missing key); with
    `optim.use_distributed_optimizer` null the kind follows the data-parallel size (on when > 1), so a resume
    under another layout (EP 2 over 2 ranks -> 1 rank) can change it."""
    if saved_distributed is None or bool(saved_distributed) == optimizer_state.is_distributed(optimizer):
        return
    kinds = ("Megatron's distributed optimizer", "a non-distributed optimizer")
    saved, now = kinds if saved_distributed else kinds[::-1]
    raise ValueError(f"checkpoint {ckpt}: its optimizer state was written by {saved}, this run has {now} "
                     f"(optim.use_distributed_optimizer: null turns it on at data-parallel size > 1 only); "
                     f"resume with optim.use_distributed_optimizer={str(bool(saved_distributed)).lower()}, "
                     "or load the model without the optimizer state")


def _load_verified(ckpt: Path, common: dict[str, Any], *, chunks: list, optimizer, load_optimizer: bool
                   ) -> dict[str, Any]:
    import torch
    from megatron.core import dist_checkpointing

    model_sd = _model_sharded_state_dict(chunks)
    state: dict[str, Any] = {"model": model_sd}
    with_opt = optimizer is not None and load_optimizer and not common.get("optimizer_fresh", False)
    if with_opt:
        if not common.get("has_optimizer", False):
            raise ValueError(f"checkpoint {ckpt}: has no optimizer state (saved with optimizer=None)")
        _check_optimizer_kind(ckpt, common.get("optimizer_distributed"), optimizer)
        fmt = common.get("optimizer_format", "dp_reshardable")
        saved, now = common.get("layout") or {}, _layout()
        if fmt == "dp_reshardable" and saved and saved != now and optimizer_state.is_distributed(optimizer):
            raise ValueError(
                f"checkpoint {ckpt}: its distributed-optimizer state was saved as dp_reshardable under "
                f"{saved}, which reshards over data parallelism only; this run is {now}. Resume under the "
                "saved layout (and save again with optim.checkpoint_format=fully_reshardable), or load "
                "the model without the optimizer state")
        optimizer_state.prime_fresh_optimizer(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=True, metadata=optim_metadata(fmt))
    try:
        loaded = dist_checkpointing.load(state, str(ckpt))
    except Exception as exc:
        raise RuntimeError(f"checkpoint {ckpt}: load failed ({type(exc).__name__}: {str(exc)[:300]})") from exc
    _load_model_state(chunks, loaded["model"])
    if with_opt:
        with torch.no_grad(), optimizer_state.adam_step_kept(optimizer):
            optimizer.load_state_dict(loaded["optimizer"])
            optimizer_state.restore_adam_step(optimizer)
    return dict(common.get("extra_state", {}))
