"""Multi-sender weight sync (issue 58) into a real SGLang 0.5.23 server on CPU: a Megatron Qwen3-MoE trainer under
torchrun (gloo) sends with one sender per pipeline stage and per expert-parallel rank, each over its own named
weight-update group that the server joined (`init_weights_update_group` with `group_name`), all senders at once;
each `update_weights_from_distributed` call carries one group's bucket. At PP2, EP2 (2 ranks) and PP2xEP2
(4 ranks) the server's weights after the sync (SHA-256 of every parameter, `/weights_checker`) equal, bit for bit,
its weights after the trainer's single-sender export of the same weights was pushed over one group; the version
is the sync's. One server for the module (tests/sglang_support/real_server.py)."""

from __future__ import annotations

import pytest

from tests.integration.test_multi_sender_sync import _check, _launch

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def server(models_dir):
    from tests.sglang_support.real_server import launch
    from tests.sglang_support.tiny_model import make_tiny

    path = str(make_tiny("qwen3_moe", models_dir / "qwen3_moe"))
    srv = launch(path, pause_mode="in_place")
    yield path, srv
    srv.stop()
    assert srv.proc.poll() is not None


def _check_server(report, path, layout, *, senders, version):
    import json
    from pathlib import Path

    r, sent = _check(report, layout, senders=senders, hf_config=json.loads((Path(path) / "config.json").read_text()))
    assert r["version"] == version  # applied once every group finished (the worker's layout index + 1)
    sums = r["engine_digest"]
    assert any("experts" in n for n in sums) and len(sums) == len(r["ref_digest"])  # every parameter, experts too
    changed = [n for n in sums if sums[n] != report["engine_digest_before"].get(n)]
    assert len(changed) == len(sums), layout  # the sync changed every parameter (shifted trainer weights)
    return r, sent


@pytest.mark.timeout(1200)
def test_pp2_and_ep2_senders_bit_exact_on_real_sglang(server, tmp_path):
    path, srv = server
    report = _launch(tmp_path, ["pp2", "ep2"], nproc=2, hf=path, extra=["--sglang-url", srv.url])
    _check_server(report, path, "pp2", senders=2, version=1)
    _, sent = _check_server(report, path, "ep2", senders=2, version=2)
    by = {s["group"]: s["names"] for s in sent}  # each expert-parallel rank sent only its own experts
    assert all(".experts.2." in n or ".experts.3." in n for n in by["wu-ep2-pp0-ep1"])


@pytest.mark.timeout(1200)
def test_pp2xep2_four_senders_bit_exact_on_real_sglang(server, tmp_path):
    path, srv = server
    report = _launch(tmp_path, ["pp2ep2"], nproc=4, hf=path, extra=["--sglang-url", srv.url, "--flattened"])
    _check_server(report, path, "pp2ep2", senders=4, version=1)
