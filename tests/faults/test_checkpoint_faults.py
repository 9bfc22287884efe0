"""Checkpoint faults: disk full during save, a damaged `latest` (truncated / bit-flipped
tensor file, missing common state), every checkpoint damaged, leftover temporary directories.

The Megatron scenarios run in one subprocess (a tiny dense model on CPU, one rank) that writes its
observations to JSON; the assertions are here. Bounded time: the subprocess has a hard timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from scalerl_mega.trainer.megatron import mcore_compat

pytestmark = pytest.mark.timeout(600)  # bounded: a hang fails instead of stalling the suite

HERE = Path(__file__).resolve().parent


def _weights(t) -> list[float]:
    import torch

    with torch.no_grad():
        return [float(p.detach().double().sum()) for p in t.chunks[0].parameters()]


def _damage(ckpt: Path, mode: str) -> None:
    tensors = sorted(ckpt.glob("*.distcp"), key=lambda p: p.stat().st_size)
    if mode == "truncate":
        data = tensors[-1].read_bytes()
        tensors[-1].write_bytes(data[: len(data) // 2])
    elif mode == "bitflip":
        data = bytearray(tensors[-1].read_bytes())
        data[len(data) // 2] ^= 0x10
        tensors[-1].write_bytes(bytes(data))
    elif mode == "no_common":  # common.pt (megatron-core <= 0.18) or the torch_dist index holding it (0.19+)
        (ckpt / mcore_compat.common_state_file()).unlink()
    elif mode == "legacy_no_common":  # a checkpoint without recorded checksums: caught when loading
        (ckpt / "checksums.json").unlink()
        (ckpt / mcore_compat.common_state_file()).unlink()
    else:
        raise ValueError(mode)


def worker(root: str, out: str) -> None:
    import errno
    import functools
    import logging
    import shutil

    import torch
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.checkpoint import latest_step, loadable_step
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import SftBatch

    logs: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            logs.append(record.getMessage())

    logging.getLogger("scalerl_mega.trainer.megatron.checkpoint").addHandler(Keep())
    megatron_errors: list[str] = []  # megatron-core 0.19 logs a write worker's error, raises only its type

    class KeepMegatron(logging.Handler):
        def emit(self, record):
            megatron_errors.append(record.getMessage())

    logging.getLogger("megatron.core.dist_checkpointing").addHandler(KeepMegatron(level=logging.ERROR))
    torch.set_num_threads(1)
    cfg = MegatronConfig(model=load_model_preset("tiny_dense"), parallel=ParallelConfig(), optim=OptimConfig(lr=1e-2))
    t = MegatronPolicyTrainer(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.model.vocab_size, (4, 13), generator=g)
    batch = SftBatch(input_ids_BT=ids[:, :-1], position_ids_BT=torch.arange(12).expand(4, 12).contiguous(),
                     targets_BT=ids[:, 1:], loss_mask_BT=torch.ones(4, 12))
    res: dict = {}
    base = Path(root)
    try:
        ck = base / "ckpt"
        t.sft_step(batch)
        t.save(str(ck), extra_state={"marker": 1})
        res["w1"] = _weights(t)
        t.sft_step(batch)
        t.save(str(ck), extra_state={"marker": 2})
        res["w2"] = _weights(t)
        res["files_step2"] = sorted(p.name for p in (ck / "step_00000002").iterdir())

        # disk full while writing step 3: the writer raises ENOSPC after its first item
        original = filesystem_async._write_item
        calls = []

        @functools.wraps(original)
        def full_disk(*args, **kwargs):
            calls.append(1)
            if len(calls) > 1:
                raise OSError(errno.ENOSPC, "No space left on device (simulated)")
            return original(*args, **kwargs)

        t.sft_step(batch)
        filesystem_async._write_item = full_disk
        try:
            t.save(str(ck), extra_state={"marker": 3})
            res["enospc_raised"] = ""
        except BaseException as exc:  # noqa: BLE001 - torch's CheckpointException is a BaseException
            res["enospc_raised"] = " ".join([repr(exc)[:2000], *megatron_errors])
        finally:
            filesystem_async._write_item = original
        res["latest_after_enospc"] = (ck / "latest").read_text().strip()
        res["dirs_after_enospc"] = sorted(p.name for p in ck.iterdir())
        res["marker_after_enospc"] = t.load(str(ck))["marker"]
        res["w_after_enospc"] = _weights(t)

        # damaged latest: each mode on a fresh copy; the previous complete checkpoint is loaded
        for mode in ("truncate", "bitflip", "no_common", "legacy_no_common"):
            copy = base / f"ckpt_{mode}"
            shutil.copytree(ck, copy)
            _damage(copy / "step_00000002", mode)
            (copy / ".tmp-step_00000003").mkdir()  # and a leftover of a killed save
            (copy / ".tmp-step_00000003" / "__0_0.distcp").write_bytes(b"half")
            logs.clear()
            # what the start banner, provenance and the finished-run check report
            res[f"{mode}_steps"] = [latest_step(copy), loadable_step(copy)]
            t.sft_step(batch)  # move the weights away from both checkpoints
            res[f"{mode}_marker"] = t.load(str(copy))["marker"]
            res[f"{mode}_w"] = _weights(t)
            res[f"{mode}_logs"] = list(logs)
            res[f"{mode}_dirs"] = sorted(p.name for p in copy.iterdir())

        # every checkpoint damaged: a named error, no load
        _damage(base / "ckpt_truncate" / "step_00000001", "bitflip")
        try:
            t.load(str(base / "ckpt_truncate"))
            res["all_bad_error"] = ""
        except ValueError as exc:
            res["all_bad_error"] = str(exc)

        # retention on real checkpoints: keep 1 leaves the latest, which still loads
        from scalerl_mega.trainer.megatron.checkpoint import prune_checkpoints

        res["pruned"] = [p.name for p in prune_checkpoints(ck, keep=1)]
        res["dirs_after_prune"] = sorted(p.name for p in ck.iterdir())
        res["marker_after_prune"] = t.load(str(ck))["marker"]
        res["w_after_prune"] = _weights(t)
    finally:
        t.close()
    Path(out).write_text(json.dumps(res))


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ckpt_faults")
    out = tmp / "res.json"
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_checkpoint_faults as t; "
            f"t.worker({str(tmp)!r}, {str(out)!r})")
    proc = subprocess.run([sys.executable, "-c", f"if __name__ == '__main__':\n    {code}"], capture_output=True,
                          text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    res["root"] = str(tmp)
    return res


def test_checksums_recorded_for_every_file(scenario):
    root = Path(scenario["root"]) / "ckpt" / "step_00000002"
    sums = json.loads((root / "checksums.json").read_text())
    files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} - {"COMPLETE", "checksums.json"}
    assert set(sums["files"]) == files and mcore_compat.common_state_file() in files
    assert any(f.endswith(".distcp") for f in files)
    import hashlib

    for name, rec in sums["files"].items():
        data = (root / name).read_bytes()
        assert rec == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_disk_full_during_save_leaves_latest_intact(scenario):
    assert "ENOSPC" in scenario["enospc_raised"] or "No space left" in scenario["enospc_raised"]
    assert scenario["latest_after_enospc"] == "step_00000002"
    assert scenario["dirs_after_enospc"] == ["latest", "step_00000001", "step_00000002"]  # no .tmp left
    assert scenario["marker_after_enospc"] == 2 and scenario["w_after_enospc"] == scenario["w2"]


@pytest.mark.parametrize("mode", ["truncate", "bitflip", "no_common", "legacy_no_common"])
def test_damaged_latest_is_named_and_previous_checkpoint_loads(scenario, mode):
    assert scenario[f"{mode}_marker"] == 1
    assert scenario[f"{mode}_steps"] == [2, 1]  # `latest` names step 2; loadable_step is the step loaded
    assert scenario[f"{mode}_w"] == scenario["w1"] != scenario["w2"]
    damaged = f"ckpt_{mode}/step_00000002 is damaged"
    assert any(damaged in m for m in scenario[f"{mode}_logs"]), scenario[f"{mode}_logs"]
    assert any("loading" in m and f"ckpt_{mode}/step_00000001" in m for m in scenario[f"{mode}_logs"])
    assert ".tmp-step_00000003" not in scenario[f"{mode}_dirs"]  # leftover of a killed save cleaned


def test_every_checkpoint_damaged_names_each(scenario):
    err = scenario["all_bad_error"]
    assert "no loadable checkpoint" in err
    assert "ckpt_truncate/step_00000002 (" in err and "ckpt_truncate/step_00000001 (" in err
    assert "does not match its recorded sha256" in err or "bytes," in err


def test_retention_on_real_checkpoints_keeps_a_loadable_latest(scenario):
    assert scenario["pruned"] == ["step_00000001"]
    assert scenario["dirs_after_prune"] == ["latest", "step_00000002"]
    assert scenario["marker_after_prune"] == 2 and scenario["w_after_prune"] == scenario["w2"]


# ---------------------------------------------------------------- without Megatron
def _fake_ckpts(root: Path, steps, *, latest: int | None, incomplete=()) -> None:
    for step in steps:
        d = root / f"step_{step:08d}"
        d.mkdir(parents=True)
        (d / "COMPLETE").write_text(json.dumps({"step": step}))
        (d / "__0_0.distcp").write_bytes(b"x")
    for step in incomplete:
        (root / f"step_{step:08d}").mkdir(parents=True)
    if latest is not None:
        (root / "latest").write_text(f"step_{latest:08d}")


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_retention_keeps_the_newest_n_and_always_latest(tmp_path):
    from scalerl_mega.trainer.megatron.checkpoint import prune_checkpoints

    a = tmp_path / "a"
    _fake_ckpts(a, [1, 2, 3, 4, 10], latest=10, incomplete=[11])
    (a / ".tmp-step_00000012").mkdir()
    assert [p.name for p in prune_checkpoints(a, keep=2)] == ["step_00000003", "step_00000002", "step_00000001"]
    assert _names(a) == [".tmp-step_00000012", "latest", "step_00000004", "step_00000010", "step_00000011"]
    assert prune_checkpoints(a, keep=2) == []  # idempotent

    b = tmp_path / "b"  # latest names an older checkpoint (e.g. a resave): it survives keep=1 too
    _fake_ckpts(b, [1, 2, 3], latest=2)
    assert [p.name for p in prune_checkpoints(b, keep=1)] == ["step_00000001"]
    assert _names(b) == ["latest", "step_00000002", "step_00000003"]

    c = tmp_path / "c"  # keep=0: keep all
    _fake_ckpts(c, [1, 2, 3], latest=3)
    assert prune_checkpoints(c, keep=0) == [] and len(_names(c)) == 4

    d = tmp_path / "d"  # latest names no complete checkpoint: nothing is deleted (the last good one stays)
    _fake_ckpts(d, [1, 2], latest=3, incomplete=[3])
    assert prune_checkpoints(d, keep=1) == [] and _names(d) == ["latest", "step_00000001", "step_00000002",
                                                                "step_00000003"]
    e = tmp_path / "e"  # no latest at all (nothing ever completed there): nothing is deleted
    _fake_ckpts(e, [1, 2], latest=None)
    assert prune_checkpoints(e, keep=1) == [] and len(_names(e)) == 2


def test_loop_save_applies_train_keep_checkpoints(tmp_path):
    """`loop.save_state` prunes with `train.keep_checkpoints` after each completed save."""
    import random

    from scalerl_mega.loop import LoopState, save_state

    class Trainer:
        def save(self, root, *, step, extra_state):  # the checkpoint layout `save_checkpoint` writes
            _fake_ckpts(Path(root), [step], latest=None)
            (Path(root) / "latest").write_text(f"step_{step:08d}")

    class State:
        def state_dict(self):
            return {}

    comps = SimpleNamespace(trainer=Trainer(), sampler=State())
    cfg = SimpleNamespace(output_dir=str(tmp_path), train=SimpleNamespace(keep_checkpoints=2))
    for step in range(1, 5):
        save_state(comps, cfg, state=LoopState(step=step), outstanding=[], compute=State(), rng=random.Random(0))
    assert _names(tmp_path / "checkpoints") == ["latest", "step_00000003", "step_00000004"]


def test_leftover_tmp_from_a_killed_first_save_means_fresh_start(tmp_path):
    from scalerl_mega.loop import latest_checkpoint
    from scalerl_mega.trainer.megatron.checkpoint import candidates, clean_incomplete

    root = tmp_path / "checkpoints"
    (root / ".tmp-step_00000001").mkdir(parents=True)
    (root / ".tmp-step_00000001" / "__0_0.distcp").write_bytes(b"partial")
    cfg = SimpleNamespace(resume="auto", output_dir=str(tmp_path))
    assert latest_checkpoint(cfg) is None  # the rerun starts fresh instead of failing on the leftover
    assert candidates(root) == []
    assert clean_incomplete(root) == [root / ".tmp-step_00000001"] and list(root.iterdir()) == []


def test_candidates_order_latest_first_then_newest(tmp_path):
    from scalerl_mega.trainer.megatron.checkpoint import candidates

    for step in (2, 10, 4):
        d = tmp_path / f"step_{step:08d}"
        d.mkdir()
        (d / "COMPLETE").write_text(json.dumps({"step": step}))
    (tmp_path / "step_00000012").mkdir()  # incomplete: never a candidate
    (tmp_path / "latest").write_text("step_00000004")
    assert [p.name for p in candidates(tmp_path)] == ["step_00000004", "step_00000010", "step_00000002"]
    assert candidates(tmp_path / "step_00000002") == [tmp_path / "step_00000002"]  # an explicit dir
