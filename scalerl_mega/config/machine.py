"""Checks against this machine, run by `scalerl-train` before anything is built (skipped for
cluster.name=slurm, whose jobs run elsewhere): the requested devices exist, the tokenizer directory loads,
and a warning when bf16 parameters would be emulated on this CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.config.tree import TrainConfig


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
                check_tokenizer_dir(path, key=key)
                break
    if cfg.cluster.name == "local" and cfg.cluster.device == "cpu" and cfg.precision.params_dtype == "bfloat16":
        warn_cpu_bf16()

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
    machine; issue 26). Returns whether it warned."""
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


def check_tokenizer_dir(path: str, *, key: str) -> None:
    """Load the HF tokenizer in `path` once; any failure (missing dir, corrupt tokenizer.json -- which
    surfaces from `tokenizers` as KeyError/Exception) becomes ValueError naming `key` and the path."""
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
