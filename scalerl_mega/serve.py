"""`python -m scalerl_mega.serve`: the project's local generation engine behind SGLang's HTTP API.

A generator job step on CPU machines (and in the local-Slurm tests): it serves
:class:`~scalerl_mega.sglang_emulation.SGLangTestServer` -- which speaks the subset of SGLang
0.5.23's API the trainer's client (`rollout/sglang/`) uses and enforces SGLang's rules -- so a
trainer started with ``rollout=sglang rollout.engine_urls=[http://host:port]`` drives it exactly as it
drives real SGLang servers on a cluster (HTTP /generate, /pause_generation, distributed weight sync).

    python -m scalerl_mega.serve --host 127.0.0.1 --port 30000 experiment=demo model=tiny_moe
    python -m scalerl_mega.serve --port 30000 --hf-dir /path/to/hf_model --max-seq-len 256

The model is either the Hydra config's model (positional overrides, composed from `conf/`; random
init, the trainer pushes its weights before the first request) or a local HF directory (`--hf-dir`).
`GET /health` answers once the port is bound; `GET /health_generate` runs a one-token generation.
SIGTERM / SIGINT stop the server cleanly (exit code 0).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalModelSpec


@dataclass(kw_only=True)
class ServeSpec:
    """What the server runs: the HF model spec and the generation core's settings."""

    model: "LocalModelSpec"
    core: "CoreConfig"
    threads: int = 1
    return_routed_experts: bool = False
    """Answer `return_routed_experts` (SGLang's --enable-return-routed-experts): the trainer
    config records routes (`config.records_routes`), or the --enable-return-routed-experts flag with --hf-dir."""


def spec_from_overrides(overrides: list[str]) -> ServeSpec:
    """The model + core settings the trainer would use for a local engine, from Hydra overrides
    (`experiment=demo model=tiny_moe ...`), composed from the repository's `conf/`."""
    from scalerl_mega import build
    from scalerl_mega.compose import compose
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalModelSpec

    cfg = compose(overrides, machine=True)
    task = build.build_task(cfg)
    arch, hf_kwargs = hf_config_from_model(cfg.model)
    max_seq = build.engine_max_seq_len(cfg, task)
    if max_seq > cfg.model.max_position_embeddings:
        raise ValueError(f"model.max_position_embeddings={cfg.model.max_position_embeddings} < longest request {max_seq}")
    return ServeSpec(
        model=LocalModelSpec(arch=arch, config=hf_kwargs, init_seed=int(cfg.seed)),
        core=CoreConfig(max_batch=cfg.rollout.max_batch_size, max_seq_len=max_seq,
                        fp32_lm_head=cfg.precision.name == "fp32_head", eos_token_ids=list(task.stop_token_ids)),
        threads=int(cfg.rollout.engine_threads), return_routed_experts=build.sglang_route_layout(cfg) is not None)


def spec_from_hf_dir(path: str, *, max_seq_len: int, max_batch: int, fp32_lm_head: bool, threads: int) -> ServeSpec:
    """Serve a local HF model directory (config.json + safetensors), like `sglang.launch_server
    --model-path`."""
    import json
    from pathlib import Path

    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalModelSpec

    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"--hf-dir {path}: no config.json")
    hf = json.loads(cfg_file.read_text())
    from scalerl_mega.model.archs import arch_of_model_type
    from scalerl_mega.model.hf_import import hf_text_config

    arch = arch_of_model_type(hf_text_config(hf).get("model_type"), where=f"--hf-dir {path}: config.json").name
    eos = hf.get("eos_token_id")
    eos_ids = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    return ServeSpec(model=LocalModelSpec(arch=arch, path=path),
                     core=CoreConfig(max_batch=max_batch, max_seq_len=max_seq_len, fp32_lm_head=fp32_lm_head,
                                     eos_token_ids=eos_ids),
                     threads=threads)


LOOPBACK = ("127.0.0.1", "localhost")


def serve(spec: ServeSpec, *, host: str, port: int, stop: threading.Event) -> None:
    """Run the server on host:port until `stop` is set."""
    import torch

    from scalerl_mega.rollout.local import build_model
    from scalerl_mega.sglang_emulation import SGLangTestServer

    torch.set_num_threads(max(1, spec.threads))
    if host not in LOOPBACK:
        # SGLangTestServer binds 127.0.0.1 only; serving other hosts needs a `host` parameter there
        raise ValueError(f"--host {host}: this server binds the loopback interface only ({LOOPBACK}); "
                         "run it on the trainer's node (single-node jobs)")
    server = SGLangTestServer(build_model(spec.model), core_config=spec.core, port=port,
                              return_routed_experts=spec.return_routed_experts)
    url = server.start()
    print(f"scalerl rollout server: serving {url}", flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
        print("scalerl rollout server: stopped", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scalerl_mega.serve", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hf-dir", default=None, help="serve this HF model directory instead of the config's model")
    p.add_argument("--max-seq-len", type=int, default=512, help="with --hf-dir: longest prompt + output")
    p.add_argument("--max-batch", type=int, default=256, help="with --hf-dir: concurrent sequences")
    p.add_argument("--bf16-head", action="store_true", help="with --hf-dir: no FP32 LM head")
    p.add_argument("--threads", type=int, default=1, help="with --hf-dir: torch threads")
    p.add_argument("--enable-return-routed-experts", action="store_true",
                   help="with --hf-dir: answer return_routed_experts requests (MoE routes)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides selecting the model (experiment=demo ...)")
    a = p.parse_args(argv)
    if a.hf_dir is not None and a.overrides:
        p.error("give either --hf-dir or Hydra overrides, not both")
    if not 0 < a.port < 65536:
        p.error(f"--port {a.port} is not a TCP port")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.hf_dir is not None:
        spec = spec_from_hf_dir(a.hf_dir, max_seq_len=a.max_seq_len, max_batch=a.max_batch,
                                fp32_lm_head=not a.bf16_head, threads=a.threads)
        spec.return_routed_experts = a.enable_return_routed_experts
    else:
        spec = spec_from_overrides(list(a.overrides))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(spec, host=a.host, port=a.port, stop=stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
