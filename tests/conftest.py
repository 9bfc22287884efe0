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
