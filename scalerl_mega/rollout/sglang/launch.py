"""Launching (and restarting, stopping) an SGLang 0.5.23 server, or attaching to a running one: its
command line (`launch_command`, with `IN_PLACE_FLAGS` for in-place updates) and readiness check."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field

from scalerl_mega.rollout.sglang.client import PAUSE_MODES, SGLangClient, SGLangError, ServerDown


LORA_BACKENDS = ("triton", "csgmv", "ascend", "torch_native", "triton_v2")
"""SGLang 0.5.23's `--lora-backend` choices (`srt/arg_groups/fields/lora.py`); only torch_native runs on a CPU."""

KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
"""SGLang 0.5.23's `--kv-cache-dtype` choices (`srt/arg_groups/fields/model.py`); `rollout.kv_cache_dtype` offers
auto and the two FP8 ones."""


@dataclass(frozen=True, kw_only=True)
class LoraServing:
    """What a server serving LoRA adapters is launched with: `--enable-lora --max-lora-rank --lora-target-modules
    --lora-backend` (the adapters' rank bound and HF module names: `peft.rank`, `peft.targets`)."""

    max_rank: int
    target_modules: tuple[str, ...]
    backend: str = "csgmv"

    def __post_init__(self) -> None:
        if self.max_rank < 1:
            raise ValueError(f"LoraServing.max_rank={self.max_rank} (peft.rank) must be >= 1")
        if not self.target_modules:
            raise ValueError("LoraServing.target_modules (peft.targets) is empty")
        if self.backend not in LORA_BACKENDS:
            raise ValueError(f"LoraServing.backend={self.backend!r} must be one of {LORA_BACKENDS}")

    def args(self) -> list[str]:
        return ["--enable-lora", "--max-lora-rank", str(self.max_rank), "--lora-target-modules",
                *self.target_modules, "--lora-backend", self.backend]


@dataclass(kw_only=True)
class SGLangServerConfig:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dtype: str = "bfloat16"
    mem_fraction_static: float = 0.7
    random_seed: int = 0
    fp32_lm_head: bool = True
    """Pass --enable-fp32-lm-head (pair it with FP32 logits in the trainer; paper Sec. 3.2)."""
    skip_tokenizer_init: bool = True
    return_routed_experts: bool = False
    """Pass --enable-return-routed-experts (the server then answers `return_routed_experts` requests)."""
    weight_version: str = "0"
    pause_mode: str = "in_place"
    """The pause mode of the engine that updates this server (`SGLangEngineConfig.pause_mode`). For
    in_place the launch adds `IN_PLACE_FLAGS` (see there): without them SGLang 0.5.23 reuses KV computed
    with the old weights for prompts sharing a prefix after an update, and tags one token early."""
    base_gpu_id: int = 0
    quantization: str | None = None
    """Pass --quantization (e.g. "fp8": the model path must then be a blockwise FP8 checkpoint, whose
    `quantization_config` gives the 128x128 blocks that FP8 weight pushes fill; `rollout.quantization`)."""
    kv_cache_dtype: str = "auto"
    """Pass --kv-cache-dtype unless auto (the model dtype): e.g. fp8_e4m3, one byte per cached K or V element
    (`rollout.kv_cache_dtype`)."""
    lora: LoraServing | None = None
    """Serve LoRA adapters (`peft=lora`); None: the base model only."""
    extra_args: list[str] = field(default_factory=list)
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"SGLangServerConfig.tp_size={self.tp_size} must be >= 1")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(f"SGLangServerConfig.mem_fraction_static={self.mem_fraction_static} must be in (0, 1)")
        if self.dtype not in ("auto", "half", "float16", "bfloat16", "float", "float32"):
            raise ValueError(f"SGLangServerConfig.dtype={self.dtype!r} is not an SGLang --dtype choice")
        if self.pause_mode not in PAUSE_MODES:
            raise ValueError(f"SGLangServerConfig.pause_mode={self.pause_mode!r} must be one of {PAUSE_MODES}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"SGLangServerConfig.kv_cache_dtype={self.kv_cache_dtype!r} is not an SGLang "
                             f"--kv-cache-dtype choice {KV_CACHE_DTYPES}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


IN_PLACE_FLAGS = {"--disable-radix-cache": "disable_radix_cache", "--disable-overlap-schedule": "disable_overlap_schedule"}
"""Launch flags (-> their `/server_info` keys) a server updated with `pause_mode=in_place` needs; measured on
SGLang 0.5.23 itself (docs/sglang.md):
- --disable-radix-cache: in_place keeps requests in the running batch, so the cache cannot be flushed at the
  update (`/flush_cache` is refused while requests run) and later prompts sharing a prefix with earlier ones
  would reuse KV computed with the old weights (their log-probs off by 0.2-27 nats, tagged with the new
  version). Its cost: prompts shared by a group's samples are prefilled once per sample.
- --disable-overlap-schedule: with the overlap scheduler the batch after the pause is already launched with
  the old weights, so `weight_versions` tags one token early (the staleness accounting and routing replay
  read these tags)."""


def launch_command(cfg: SGLangServerConfig) -> list[str]:
    """`python -m sglang.launch_server ...` with SGLang 0.5.23's server flags."""
    cmd = [
        cfg.python, "-m", "sglang.launch_server",
        "--model-path", cfg.model_path,
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--tp-size", str(cfg.tp_size),
        "--dtype", cfg.dtype,
        "--mem-fraction-static", str(cfg.mem_fraction_static),
        "--random-seed", str(cfg.random_seed),
        "--base-gpu-id", str(cfg.base_gpu_id),
        "--weight-version", cfg.weight_version,
        "--skip-server-warmup",
    ]  # fmt: skip
    if cfg.skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    if cfg.fp32_lm_head:
        cmd.append("--enable-fp32-lm-head")
    if cfg.return_routed_experts:
        cmd.append("--enable-return-routed-experts")
    if cfg.pause_mode == "in_place":
        cmd += list(IN_PLACE_FLAGS)
    if cfg.quantization:
        cmd += ["--quantization", cfg.quantization]
    if cfg.kv_cache_dtype != "auto":
        cmd += ["--kv-cache-dtype", cfg.kv_cache_dtype]
    if cfg.lora is not None:
        cmd += cfg.lora.args()
    return cmd + list(cfg.extra_args)


class SGLangServer:
    """A server we launched (restartable) or attached to (url only)."""

    def __init__(self, *, url: str, config: SGLangServerConfig | None = None, tp_size: int = 1) -> None:
        self.url = url.rstrip("/")
        self.config = config
        self.tp_size = config.tp_size if config is not None else tp_size
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

    @classmethod
    def launch(cls, config: SGLangServerConfig, *, wait: bool = True) -> "SGLangServer":
        server = cls(url=config.url, config=config)
        server.start(wait=wait)
        return server

    @classmethod
    def attach(cls, url: str, *, tp_size: int = 1) -> "SGLangServer":
        return cls(url=url, tp_size=tp_size)

    @property
    def restartable(self) -> bool:
        return self.config is not None

    def start(self, *, wait: bool = True) -> None:
        import os

        if self.config is None:
            raise SGLangError(f"server {self.url} was attached, not launched: cannot start it")
        env = dict(os.environ, **self.config.env)
        # its own process group: SGLang forks a scheduler and a detokenizer, `stop` ends them all
        self.proc = subprocess.Popen(launch_command(self.config), env=env, start_new_session=True)
        if wait:
            self.wait_healthy(timeout_s=self.config.startup_timeout_s)

    def alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return False
        return SGLangClient(self.url, timeout_s=10.0).health_generate()

    def wait_healthy(self, *, timeout_s: float) -> None:
        """Poll GET /health_generate until 200 (slime's readiness check)."""
        deadline = time.monotonic() + timeout_s
        client = SGLangClient(self.url, timeout_s=10.0)
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerDown(f"SGLang server {self.url} exited with code {self.proc.returncode} during startup")
            if client.health_generate():
                return
            time.sleep(1.0)
        raise ServerDown(f"SGLang server {self.url} not healthy within {timeout_s}s")

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start(wait=True)

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `timeout_s`, and return once
        no process of the group remains (SGLang's scheduler and detokenizer included)."""
        import os
        import signal

        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.proc.poll()  # reap the leader
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    self.proc.wait()
                    return
                time.sleep(0.2)
        self.proc.wait(timeout=10)
