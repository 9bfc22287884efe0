"""Fixtures of the `sglang`-marked tests: the tiny checkpoints and helpers shared by the modules, each of
which launches its own real SGLang server (module scope; tests/sglang_support/real_server.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    """Where the tiny checkpoints are written: $SCALERL_SGLANG_MODELS (`make test-sglang` makes them there
    once), else a temporary directory."""
    import os
    from pathlib import Path

    d = os.environ.get("SCALERL_SGLANG_MODELS")
    return Path(d) if d else tmp_path_factory.mktemp("sglang_models")


@pytest.fixture(scope="session")
def llama_dir(models_dir):
    from tests.sglang_support.tiny_model import make_tiny_llama

    return str(make_tiny_llama(models_dir / "llama"))


@pytest.fixture(scope="session", autouse=True)
def _no_server_outlives_the_session():
    """Safety net behind the modules' own teardown: stop (process group, polled until gone) every real
    server still running when the session ends."""
    yield
    from tests.sglang_support.real_server import LAUNCHED

    for server in LAUNCHED:
        server.stop()
