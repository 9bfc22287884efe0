"""Compute accounting for the scaling law (paper Sec. 2, App. A.3).

C is GPU-hours of the whole allocation (generators + trainers): wall time x devices, whether or not
a device is busy. On CPU the same quantity is process-hours (`compute_device_hours`: wall time x the
trainer and engine processes) and `compute_gpu_hours` is 0. NVML utilisation is logged next to it
when GPUs exist (pynvml from nvidia-ml-py, imported lazily).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def allocation_devices(*, trainer_devices: int, generator_devices: int, num_engines: int,
                       devices_per_engine: int) -> int:
    """Devices of the whole allocation, each counted once (paper App. A.3: 16 trainer + 64 generator
    GPUs = 80): the trainer job's devices plus the generators' total, which is `generator_devices`
    when given (> 0: the allocation's generator devices, however they are split into engines), else
    `num_engines` x `devices_per_engine` (an SGLang server's TP size; 1 for a local engine)."""
    for key, value in (("trainer_devices", trainer_devices), ("num_engines", num_engines),
                       ("devices_per_engine", devices_per_engine)):
        if value < 1:
            raise ValueError(f"allocation_devices: {key}={value} must be >= 1")
    if generator_devices < 0:
        raise ValueError(f"allocation_devices: generator_devices={generator_devices} must be >= 0")
    return trainer_devices + (generator_devices or num_engines * devices_per_engine)


class ComputeCounter:
    """Accumulates wall-clock hours x devices; survives restarts through `state_dict`."""

    def __init__(self, *, devices: int, on_gpu: bool, clock: Callable[[], float] = time.monotonic):
        if devices <= 0:
            raise ValueError(f"devices={devices} must be > 0")
        self.devices = devices
        self.on_gpu = on_gpu
        self._clock = clock
        self._start = clock()
        self._hours_before = 0.0
        """Wall hours accumulated by earlier incarnations of this run (resume)."""

    def wall_hours(self) -> float:
        return self._hours_before + (self._clock() - self._start) / 3600.0

    def device_hours(self) -> float:
        """Wall hours x devices of the whole allocation."""
        return self.wall_hours() * self.devices

    def fields(self) -> dict[str, float]:
        """The compute fields every metrics line carries."""
        hours = self.device_hours()
        return {
            "compute_gpu_hours": hours if self.on_gpu else 0.0,
            "compute_device_hours": hours,
            "wall_hours": self.wall_hours(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"wall_hours": self.wall_hours(), "devices": self.devices, "on_gpu": self.on_gpu}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._hours_before = float(state["wall_hours"])
        self._start = self._clock()


def gpu_utilization() -> float | None:
    """Mean NVML utilisation (%) over this node's GPUs, or None without GPUs/NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver or library: a CPU machine
        return None
    try:
        n = pynvml.nvmlDeviceGetCount()
        if n == 0:
            return None
        util = [pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(i)).gpu for i in range(n)]
        return float(sum(util)) / n
    finally:
        pynvml.nvmlShutdown()


DENSE_BF16_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0, "H800": 989.0, "B200": 2250.0, "GB200": 2500.0}
"""Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by GPU model name, for MFU (NVIDIA data sheets; H100/H200
SXM; B200/GB200 per GPU)."""


def dense_bf16_peak_tflops(device_name: str) -> float | None:
    """The `DENSE_BF16_TFLOPS` entry whose key the device name contains (the longest: GB200 before B200), or
    None for an unknown device (no MFU is reported then)."""
    hits = [k for k in DENSE_BF16_TFLOPS if k in device_name.upper()]
    return DENSE_BF16_TFLOPS[max(hits, key=len)] if hits else None


def train_flops(model: Any, seq_lens: list[int]) -> float:
    """Model FLOPs of one optimizer step over sequences of these lengths (the MFU convention: forward plus
    backward = 3 forwards, no recomputation counted): 6 P T per sequence for the P matmul parameters per
    token (`model.num_params()["active"]` less the input embedding, whose lookup is no matmul; the LM head
    counts), plus causal self-attention 6 L d T^2 (Q K^T and P V, 2 T^2 d each over the T^2 / 2 causal
    positions, times 3) with d = heads x head width. `model`: a `ModelConfig`."""
    p = model.num_params()["active"] - model.vocab_size * model.hidden_size
    d = model.num_attention_heads * model.kv_channels
    return float(sum(6.0 * p * t + 6.0 * model.num_layers * d * t * t for t in seq_lens))
