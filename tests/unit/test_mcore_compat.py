"""mcore_compat: the one module that knows how the supported Megatron-Core releases differ. Each fact is
checked against the installed release's own source text (an independent reading), so the same test holds
on 0.16.1 (`make test`) and 0.19.2 (`make test-compat`) and fails if a fact is wrong for either."""

from __future__ import annotations

import inspect
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from scalerl_mega.trainer.megatron import cpu_compat, mcore_compat  # noqa: E402


def test_version_is_the_installed_release_and_in_the_tested_range():
    import megatron.core

    # package_info's string may carry a local tag (0.19.2 appends the git hash of the working directory)
    want = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", megatron.core.__version__).groups())
    assert mcore_compat.version() == want
    assert mcore_compat.OLDEST_TESTED <= want <= mcore_compat.NEWEST_TESTED
    assert mcore_compat.describe() == f"megatron-core {'.'.join(map(str, want))} (tested range 0.16.1..0.19.2)"


def test_facts_match_the_installed_source():
    from megatron.core.optimizer import optimizer
    from megatron.core.transformer.moe import moe_utils, router

    router_src = inspect.getsource(router)
    assert mcore_compat.router_saves_aux_losses_through_moe_utils() == ("save_to_aux_losses_tracker(" in router_src)
    sync_src = inspect.getsource(mcore_compat.grad_bucket_group_class().start_grad_sync)
    assert mcore_compat.grad_sync_uses_cuda_streams() == ("torch.cuda.current_stream()" in sync_src)
    flag = getattr(optimizer.MegatronOptimizer, "has_grad_norm_group", None)
    assert mcore_compat.optimizer_has_grad_norm_groups() == (flag is not None)
    if flag is not None:
        assert "device='cuda'" in inspect.getsource(flag)
    # 0.17+ binds te_general_gemm to None in the no-TE branch of its imports; 0.16.1 only imports it under TE
    utils_src = inspect.getsource(moe_utils)
    bound_without_te = re.search(r"else:\s*\(\s*[\w,\s]*te_general_gemm,\s*\)\s*=\s*\(None", utils_src) is not None
    assert mcore_compat.moe_utils_defines_te_general_gemm() == bound_without_te


def test_clear_moe_aux_losses_zeroes_the_tracker():
    from megatron.core.transformer.moe import moe_utils

    cpu_compat.apply()  # 0.16.1's tracker allocates on device="cuda" (failure 3)
    moe_utils.save_to_aux_losses_tracker("scalerl_probe_loss", torch.tensor(2.5), 1, 2)
    values = moe_utils.get_moe_layer_wise_logging_tracker()["scalerl_probe_loss"]["values"]
    assert values.tolist() == [2.5, 0.0]  # layer 1 of 2 at index 0 (layer numbers count from 1)
    mcore_compat.clear_moe_aux_losses()
    assert moe_utils.get_moe_layer_wise_logging_tracker()["scalerl_probe_loss"]["values"].tolist() == [0.0, 0.0]
