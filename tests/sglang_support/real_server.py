"""A real SGLang 0.5.23 server on this machine's CPU, launched through the project's own `SGLangServer`.

The server runs in the generator environment `.venv-sglang` (`.ci/sglang_env.sh`; SGLang pins torch
2.14.1, the trainer 2.13.0): `SCALERL_SGLANG_PYTHON` names another interpreter. What makes SGLang run on
a CPU without AMX (shared/reference/SGLANG_CPU.md): its opt-in CPU engine (`SGLANG_USE_CPU_ENGINE=1`),
torch-native attention and sampling, no CUDA graphs, FP32, and the `sgl_kernel` stand-in of
`server_path/` on the server's PYTHONPATH. Everything else is the project's launch: `launch_command`
adds --skip-tokenizer-init --enable-fp32-lm-head --weight-version and, for `pause_mode="in_place"`,
`IN_PLACE_FLAGS`.
"""

from __future__ import annotations

import os
from pathlib import Path

from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer, SGLangServerConfig
from scalerl_mega.rollout.sglang.launch import LoraServing
from scalerl_mega.weight_sync import WeightSyncConfig, free_port

ROOT = Path(__file__).resolve().parents[2]
SERVER_PATH = Path(__file__).resolve().parent / "server_path"
LORA_SERVER_PATH = Path(__file__).resolve().parent / "lora_server_path"
"""Added to the PYTHONPATH of a server launched with LoRA: its `sitecustomize` drops SGLang's pinned host memory,
which a CPU cannot give (test-only; the package never carries it)."""
CPU_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
            "--disable-cuda-graph", "--context-length", "256", "--max-running-requests", "8",
            "--max-total-tokens", "4096", "--grammar-backend", "none"]


def sglang_python() -> str:
    """The generator environment's interpreter; fails naming the fix when it is missing."""
    py = os.environ.get("SCALERL_SGLANG_PYTHON") or str(ROOT / ".venv-sglang" / "bin" / "python")
    if not os.access(py, os.X_OK):
        raise RuntimeError(f"no SGLang environment at {py}: run `make test-sglang` (it runs .ci/sglang_env.sh) "
                           "or set SCALERL_SGLANG_PYTHON")
    return py


def cpu_server_config(model_path: str | Path, *, pause_mode: str = "in_place", return_routed_experts: bool = False,
                      extra_args: tuple[str, ...] = (), lora: LoraServing | None = None) -> SGLangServerConfig:
    """The project's server config with the CPU settings (FP32, one free loopback port); with `lora`, the
    pinned-memory stand-in of `LORA_SERVER_PATH` joins the PYTHONPATH."""
    path = [str(SERVER_PATH)] + ([str(LORA_SERVER_PATH)] if lora is not None else [])
    env = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_CPU_OMP_THREADS_BIND": os.environ.get("SGLANG_CPU_OMP_THREADS_BIND", "0-1"),
           "PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1"}
    return SGLangServerConfig(
        model_path=str(model_path), port=free_port(), dtype="float32", pause_mode=pause_mode, lora=lora,
        return_routed_experts=return_routed_experts, python=sglang_python(), env=env,
        extra_args=CPU_ARGS + list(extra_args), startup_timeout_s=600.0)


LAUNCHED: list[SGLangServer] = []
"""Every server `launch` started (the session's last teardown stops any still running)."""


def launch(model_path: str | Path, **kw) -> SGLangServer:
    """Start a server and wait for GET /health_generate (a real one-token generation); `stop()` it."""
    cfg = cpu_server_config(model_path, **kw)
    server = SGLangServer(url=cfg.url, config=cfg)
    LAUNCHED.append(server)
    try:
        server.start(wait=True)
    except BaseException:
        server.stop()
        raise
    return server


def engine_for(*servers: SGLangServer, pause_mode: str, adapter_dir: str | None = None,
               body_hook=None) -> SGLangRolloutEngine:
    """The project's engine over real servers: gloo weight sync in 64 KiB buckets (several per update),
    60 s deadlines."""
    return SGLangRolloutEngine(list(servers), body_hook=body_hook, config=SGLangEngineConfig(
        pause_mode=pause_mode, control_timeout_s=60.0, request_timeout_s=300.0, adapter_dir=adapter_dir,
        sync=WeightSyncConfig(backend="gloo", timeout_s=60.0, bucket_bytes=64 << 10)))


def require_gpu_sglang() -> str:
    """The SGLang interpreter for a GPU test (tests/gpu, the GPU kit); skips the test without CUDA or without the
    SGLang environment."""
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    try:
        return sglang_python()
    except RuntimeError as exc:
        pytest.skip(str(exc))


def gpu_engine(model_path: str | Path, *, spec, pause_mode: str,
               quantization: str | None = None) -> tuple[SGLangServer, SGLangRolloutEngine]:
    """A real SGLang server on this machine's GPU (bf16, 30% of its memory, 256-token context, 8 requests) serving
    `model_path`, started and healthy, and the project's engine over it, building its updates for `spec` (a
    `LocalModelSpec`): gloo weight sync in flattened 256 KiB buckets, 120 s deadlines. The caller closes the engine
    and stops the server."""
    cfg = SGLangServerConfig(model_path=str(model_path), port=free_port(), dtype="bfloat16", pause_mode=pause_mode,
                             quantization=quantization, mem_fraction_static=0.3, python=require_gpu_sglang(),
                             env={"PYTHONUNBUFFERED": "1"},
                             extra_args=["--context-length", "256", "--max-running-requests", "8"])
    server = SGLangServer(url=cfg.url, config=cfg)
    LAUNCHED.append(server)
    server.start(wait=True)
    return server, SGLangRolloutEngine([server], config=SGLangEngineConfig(
        pause_mode=pause_mode, control_timeout_s=120.0, request_timeout_s=300.0, model=spec,
        sync=WeightSyncConfig(backend="gloo", flattened=True, timeout_s=120.0, bucket_bytes=256 << 10)))
