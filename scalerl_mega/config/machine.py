"""Checks against this machine, run by `scalerl-train` before anything is built (skipped for
cluster.name=slurm, whose jobs run elsewhere): the requested devices exist, the tokenizer directory loads,
and a warning when bf16 parameters would be emulated on this CPU; the launcher's WORLD_SIZE matches
`cluster.trainer_devices` (a Slurm run's: inside its job, where WORLD_SIZE is set)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config.tree import TrainConfig
    from scalerl_mega.interfaces import Tokenizer


def validate_machine(cfg: TrainConfig) -> None:
    """Checks against this machine (run by `scalerl-train` before anything is built; skipped for
    cluster.name=slurm, whose jobs run elsewhere): the requested devices exist, and the tokenizer
    directory loads. Raises ValueError naming the key."""
    if cfg.cluster.name == "local" and cfg.cluster.device == "cuda":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have == 0:
            raise ValueError("cluster.device='cuda' but this machine has no usable CUDA device")
        if cfg.cluster.devices_per_node > have:
            raise ValueError(f"cluster.devices_per_node={cfg.cluster.devices_per_node} but this machine has "
                             f"{have} CUDA device(s)")
        if cfg.cluster.trainer_devices > have:
            raise ValueError(f"cluster.trainer_devices={cfg.cluster.trainer_devices} but this machine has "
                             f"{have} CUDA device(s)")
    if cfg.cluster.name == "local" and cfg.data.name != "synthetic":
        for key, path in (("data.tokenizer_path", str(cfg.data.tokenizer_path)), ("init_from_hf", str(cfg.init_from_hf))):
            if path:
                check_tokenizer_fits(check_tokenizer_dir(path, key=key), cfg, key=key, path=path)
                break
    if cfg.cluster.name == "local" and cfg.cluster.device == "cpu" and cfg.precision.params_dtype == "bfloat16":
        warn_cpu_bf16()
    if cfg.cluster.name == "local" or "WORLD_SIZE" in os.environ:  # a Slurm run's ranks are its job's, not here
        check_world_size(cfg)


def check_world_size(cfg: TrainConfig) -> int:
    """The trainer's ranks (WORLD_SIZE of its launcher, torchrun / srun; 1 without one) against
    `cluster.trainer_devices` (0: take it from the launcher); returns the world size. Run by `--validate` and by
    the run (train._process_setup) alike, in the launcher's environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if getattr(cfg, "dry_run", False):  # the meta-device dry run plans cluster.trainer_devices ranks in one process
        return world
    if cfg.cluster.trainer_devices and cfg.cluster.trainer_devices != world:
        raise ValueError(f"cluster.trainer_devices={cfg.cluster.trainer_devices} but this trainer job has "
                         f"WORLD_SIZE={world} ranks (set cluster.trainer_devices={world}, or 0 to take it "
                         "from the launcher)")
    return world

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""/proc/cpuinfo flags of native bf16 arithmetic: x86 AVX512-BF16 and AMX-BF16, AArch64 BF16 (`Features`)."""
_cpu_bf16_warned = False


def cpu_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU computes bf16 natively (`CPU_BF16_FLAGS` among the flags of `cpuinfo`, default
    /proc/cpuinfo); None when that cannot be read (not Linux)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return any(f in flags for f in CPU_BF16_FLAGS)


def warn_cpu_bf16(*, cpuinfo: str | None = None) -> bool:
    """Warn (once per process, rank 0 only) that bf16 parameters on a CPU without native bf16 run
    emulated: several times slower than FP32 (4.7x on the reproduction config, measured on an AVX2-only
    machine). Returns whether it warned."""
    import logging
    import os

    global _cpu_bf16_warned
    if _cpu_bf16_warned or os.environ.get("RANK", "0") != "0" or cpu_native_bf16(cpuinfo) is not False:
        return False
    _cpu_bf16_warned = True
    logging.getLogger("scalerl_mega.config").warning(
        "precision.params_dtype=bfloat16 with cluster.device=cpu: this CPU has no native bf16 (none of %s in "
        "/proc/cpuinfo), so bf16 matmuls are emulated and run several times slower than FP32 (4.7x measured on "
        "the reproduction config). Override with precision.params_dtype=float32 (the FP32 head stays on).",
        "/".join(CPU_BF16_FLAGS))
    return True


def check_tokenizer_dir(path: str, *, key: str) -> Any:
    """Load the HF tokenizer in `path` once and return it; any failure (missing dir, corrupt tokenizer.json --
    which surfaces from `tokenizers` as KeyError/Exception) becomes ValueError naming `key` and the path."""
    import os

    if not os.path.isdir(path):
        raise ValueError(f"{key}={path!r}: no such directory")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - every loader failure is a bad tokenizer directory
        raise ValueError(f"{key}={path!r}: not a loadable HF tokenizer ({type(exc).__name__}: {exc})") from exc
    if getattr(tok, "eos_token_id", None) is None:
        raise ValueError(f"{key}={path!r}: the tokenizer has no EOS token")
    return tok


FREE_TEXT_VOCAB = 1000
"""A model with a smaller vocabulary cannot read free text (the embedded demo model has the synthetic task's 48)."""


def free_text_hint(cfg: TrainConfig) -> str:
    """What to set for a dataset run, with why the model cannot read it when its vocabulary is the demo's."""
    v = int(cfg.model.vocab_size)
    why = (f"a model of model.vocab_size={v} tokens cannot read free text (the embedded demo model's vocabulary is "
           "the synthetic task's digits and symbols); " if v < FREE_TEXT_VOCAB else "")
    return (f"{why}use a pretrained model and its tokenizer: model=hf init_from_hf=/path/to/hf_checkpoint (its "
            "tokenizer is used), or data.tokenizer_path=/path/to/tokenizer with a model whose vocab_size covers it "
            "(docs/extending.md)")


def check_tokenizer_source(cfg: TrainConfig) -> None:
    """A dataset run (data.name != synthetic) needs a tokenizer: `data.tokenizer_path` or `init_from_hf`. With a
    model of fewer than `FREE_TEXT_VOCAB` tokens (the demo's) the tokenizer is also loaded and checked against it
    here, first: that mismatch, not the data's details, is what such a run must hear about."""
    if cfg.data.name == "synthetic":
        return
    for key in ("data.tokenizer_path", "init_from_hf"):
        path = str(cfg.data.tokenizer_path if key == "data.tokenizer_path" else getattr(cfg, "init_from_hf", ""))
        if path:
            break
    else:
        raise ValueError(f"data.name={cfg.data.name!r} needs a tokenizer (data.tokenizer_path and init_from_hf are "
                         f"empty): {free_text_hint(cfg)}")
    import os

    if int(cfg.model.vocab_size) < FREE_TEXT_VOCAB and os.path.isdir(path):
        check_tokenizer_fits(check_tokenizer_dir(path, key=key), cfg, key=key, path=path)


def check_tokenizer_fits(tok: Tokenizer, cfg: TrainConfig, *, key: str, path: str) -> None:
    """The dataset tokenizer `tok` (of `key`=`path`) against the run: the model's vocabulary holds it, it has an
    EOS token, and it maps no character of the interruption phrase to unknown. ValueError naming the keys."""
    if len(tok) > int(cfg.model.vocab_size):
        hint = f"; {free_text_hint(cfg)}" if int(cfg.model.vocab_size) < FREE_TEXT_VOCAB else ""
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's vocabulary "
                         f"({len(tok)} tokens, {key}={path!r}){hint}")
    if getattr(tok, "eos_token_id", None) is None:
        raise ValueError(f"{key}={path!r}: the tokenizer has no EOS token")
    ids = list(tok(cfg.length.interruption_phrase, add_special_tokens=False)["input_ids"])
    if tok.unk_token_id is not None and tok.unk_token_id in ids:
        raise ValueError(f"length.interruption_phrase={cfg.length.interruption_phrase!r} has characters the "
                         f"tokenizer maps to unknown ({key}={path!r})")
