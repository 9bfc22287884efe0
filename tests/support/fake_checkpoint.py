"""A checkpoint directory in the checkpoint module's layout (trainer/megatron/checkpoint.py) without Megatron: one
tensor-file stand-in, its `checksums.json` (size + sha256), the COMPLETE marker with the step, `latest` naming it.
What `checkpoint.candidates`, `verify_checkpoint`, `latest_step` and `loadable_step` read."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from scalerl_mega.trainer.megatron.checkpoint import CHECKSUMS_FORMAT


def save_fake_checkpoint(root: Path, step: int) -> Path:
    """A complete checkpoint of `step` under the checkpoint root `root` (replacing one of the same step),
    `latest` naming it."""
    d = root / f"step_{step:08d}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    data = bytes(range(256)) * (step + 1)
    (d / "__0_0.distcp").write_bytes(data)
    (d / "checksums.json").write_text(json.dumps({"format": CHECKSUMS_FORMAT, "files": {
        "__0_0.distcp": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}))
    (d / "COMPLETE").write_text(json.dumps({"step": step}))
    (root / "latest").write_text(d.name)
    return d


def flip_a_bit(ckpt: Path) -> None:
    """Damage `ckpt` the way a bad disk does: one bit of its tensor file flipped (same size)."""
    f = ckpt / "__0_0.distcp"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
