"""Differences between the Megatron-Core releases this project supports, in one place.

Supported and tested on CPU: megatron-core 0.16.1 (the newest release for Python 3.11; `make test`) to 0.19.2
(the newest release, Python >= 3.12; `make test-compat`). Every place where the releases differ is answered
here, by probing the installed package (an attribute that exists or not) where that is possible and by its
version otherwise; the rest of the code asks these functions and never compares versions itself.

What changed between 0.16.1 and 0.19.2 that this project meets (found by running the Megatron tests on both):

* 0.17: `moe_utils` defines `te_general_gemm = None` without TransformerEngine (0.16.1 left the name
  undefined: cpu_compat failure 4 is fixed upstream).
* 0.17: DDP's `_ParamAndGradBucketGroup.start_grad_sync` waits on `torch.cuda.current_stream()` for CUDA-graph
  events before every gradient reduction (cpu_compat failure 11).
* 0.18: the MoE router records its aux losses through `moe_logging.get_moe_metrics_tracker()` (device-aware)
  instead of `moe_utils.save_to_aux_losses_tracker` (a literal CUDA allocation, cpu_compat failure 3); the old
  `moe_utils` tracker functions are deprecated wrappers of the new tracker.
* 0.19: the optimizers group gradient norms (`MegatronOptimizer.has_grad_norm_group`), with a flag tensor
  allocated on `device='cuda'` (cpu_compat failure 3).
* 0.19: dist-checkpoints keep their common state inside the torch_dist files (no `common.pt`), and a
  failed write worker surfaces as "error: <class 'OSError'>" with its message only in Megatron's log.
* 0.19: `SelfAttention` refuses a spec's q/k norm (Llama-4's `L2Norm`) unless `TransformerConfig.qk_layernorm`
  or `qk_l2_norm` is set; `models.transformer_config` sets `qk_l2_norm` from the model (a field in every
  supported release, so no branch).

Import-free at module level: megatron is imported inside the functions (it is optional on a machine
that only runs the generator or the scaling fits).
"""

from __future__ import annotations

import functools
import re

OLDEST_TESTED = (0, 16, 1)
NEWEST_TESTED = (0, 19, 2)


@functools.cache
def version() -> tuple[int, int, int]:
    """The installed megatron-core's (major, minor, patch); pre-release and local tags are dropped."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        text = dist_version("megatron-core")
    except PackageNotFoundError:  # a source checkout on PYTHONPATH (no dist-info)
        from megatron.core import package_info

        text = package_info.__version__
    parts = [int(x) for x in re.findall(r"\d+", text)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


def describe() -> str:
    """One line for logs and errors: the installed version and whether it lies in the tested range."""
    v = version()
    span = f"{'.'.join(map(str, OLDEST_TESTED))}..{'.'.join(map(str, NEWEST_TESTED))}"
    inside = OLDEST_TESTED <= v <= NEWEST_TESTED
    return f"megatron-core {'.'.join(map(str, v))} ({'tested' if inside else 'outside the tested'} range {span})"


# ----------------------------------------------------------------------------- facts (cpu_compat)
def moe_utils_defines_te_general_gemm() -> bool:
    """0.17+: `moe_utils.te_general_gemm` is None without TransformerEngine (0.16.1: NameError, failure 4).
    By version: cpu_compat's patch 4 defines the name on 0.16.1, so its presence cannot tell."""
    return version() >= (0, 17, 0)


def router_saves_aux_losses_through_moe_utils() -> bool:
    """<= 0.17: `router.py` imports `save_to_aux_losses_tracker` (failure 3's literal CUDA allocation);
    0.18+ records through the device-aware `get_moe_metrics_tracker()`."""
    from megatron.core.transformer.moe import router

    return hasattr(router, "save_to_aux_losses_tracker")


def optimizer_has_grad_norm_groups() -> bool:
    """0.19+: `MegatronOptimizer.has_grad_norm_group` all-reduces a flag allocated with `device='cuda'`
    before every grad-norm computation (failure 3)."""
    from megatron.core.optimizer import optimizer

    return hasattr(optimizer.MegatronOptimizer, "has_grad_norm_group")


def grad_sync_uses_cuda_streams() -> bool:
    """0.17+: `_ParamAndGradBucketGroup.start_grad_sync` calls `torch.cuda.current_stream()` (failure 11)."""
    return version() >= (0, 17, 0)


def grad_bucket_group_class():
    """DDP's bucket-group class (private in every supported release)."""
    from megatron.core.distributed import param_and_grad_buffer

    return param_and_grad_buffer._ParamAndGradBucketGroup


def common_state_file() -> str:
    """The checkpoint file whose loss makes a dist-checkpoint's common (non-tensor) state unreadable:
    `common.pt` up to 0.18; 0.19+ stores the common state as a sharded object inside the torch_dist files,
    read through their `.metadata` index (`dist_checkpointing.load_common_state_dict` reads either)."""
    return "common.pt" if version() < (0, 19, 0) else ".metadata"


# ----------------------------------------------------------------------------- API moves
def clear_moe_aux_losses() -> None:
    """Empty the MoE aux-loss tracker (it holds tensors and groups of the previous parallel layout)."""
    try:
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
    except ImportError:  # 0.16.1: the module-level tracker in moe_utils
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker

        clear_aux_losses_tracker()
        return
    get_moe_metrics_tracker().clear()
