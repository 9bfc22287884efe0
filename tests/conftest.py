"""Shared pytest setup: GPU tests are skipped without CUDA; nothing heavy is imported here."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (this machine has no GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_torch_thread():
    """Run the test with one intra-op torch thread, restoring the old count after.

    The rollout tests compare tokens and log-probs computed in different processes and threads;
    one thread keeps their reductions in one order and keeps a loaded 2-core CI box responsive.
    """
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
