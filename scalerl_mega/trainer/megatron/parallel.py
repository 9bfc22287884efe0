"""torch.distributed + Megatron parallel state from a ParallelConfig (gloo on CPU, nccl on GPU).

Call order: validate configs (no process group yet) -> `init_parallel` -> build model -> ...
-> `teardown_parallel`. On machines without CUDA, `init_parallel` applies `cpu_compat`.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Optional

from scalerl_mega.model.config import ModelConfig, ParallelConfig


@dataclass(kw_only=True, frozen=True)
class ParallelInfo:
    """This process's place in the layout (after initialisation)."""

    world_size: int
    rank: int
    tp: int
    pp: int
    ep: int
    dp: int
    tp_rank: int
    pp_rank: int
    ep_rank: int
    dp_rank: int
    device: str
    """"cpu" or "cuda:<local_rank>"."""

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_parallel(parallel: ParallelConfig, *, model: Optional[ModelConfig] = None, seed: int = 1234,
                  timeout_minutes: int = 10) -> ParallelInfo:
    """Validate, start torch.distributed (env:// rendezvous; a world of 1 if no launcher env), and
    initialise Megatron's TP/PP/EP/DP groups and model-parallel RNG seeds.

    Validation runs first, so a bad layout fails before any process group exists. If a process
    group already exists it is reused (several layouts can run one after another in one launch).
    """
    world_size = world_size_from_env()
    parallel.validate(model, world_size=world_size)
    import torch
    import torch.distributed as dist

    from scalerl_mega.trainer.megatron import cpu_compat

    use_cuda = torch.cuda.is_available()
    backend = parallel.backend if parallel.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        raise ValueError("parallel: backend='nccl' but CUDA is not available")
    if not use_cuda:
        cpu_compat.apply()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group(backend=backend, world_size=world_size,
                                rank=int(os.environ.get("RANK", "0")),
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    from megatron.core import tensor_parallel

    init_megatron_groups(parallel, timeout_minutes=timeout_minutes)
    torch.manual_seed(seed)  # CPU initialisation draws full weights on every rank, then splits them
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return parallel_info()


def init_megatron_groups(parallel: ParallelConfig, *, timeout_minutes: int = 10,
                         create_gloo_process_groups: bool = True) -> None:
    """(Re)initialise Megatron's TP/CP/PP/EP/ETP/DP groups on the existing default process group."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=parallel.tp,
                                 pipeline_model_parallel_size=parallel.pp,
                                 context_parallel_size=parallel.cp,
                                 expert_model_parallel_size=parallel.ep,
                                 expert_tensor_parallel_size=parallel.expert_tp(),
                                 distributed_timeout_minutes=timeout_minutes,
                                 create_gloo_process_groups=create_gloo_process_groups)


def parallel_info() -> ParallelInfo:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    return ParallelInfo(world_size=dist.get_world_size(), rank=dist.get_rank(),
                        tp=ps.get_tensor_model_parallel_world_size(),
                        pp=ps.get_pipeline_model_parallel_world_size(),
                        ep=ps.get_expert_model_parallel_world_size(),
                        dp=ps.get_data_parallel_world_size(),
                        tp_rank=ps.get_tensor_model_parallel_rank(),
                        pp_rank=ps.get_pipeline_model_parallel_rank(),
                        ep_rank=ps.get_expert_model_parallel_rank(),
                        dp_rank=ps.get_data_parallel_rank(), device=device)


def teardown_parallel(*, destroy_process_group: bool = True) -> None:
    """Destroy Megatron's groups (and, by default, the torch.distributed default group)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    # the MoE aux-loss tracker holds tensors and groups from the previous layout; a failure here is a
    # megatron-core release difference mcore_compat has to learn about, so it is raised, not hidden
    from scalerl_mega.trainer.megatron import mcore_compat

    mcore_compat.clear_moe_aux_losses()
    if destroy_process_group and dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port that is free now (for a rendezvous on 127.0.0.1)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
