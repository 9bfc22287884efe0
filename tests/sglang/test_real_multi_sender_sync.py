"""Multi-sender weight sync into a real SGLang 0.5.23 server on CPU: a Megatron Qwen3-MoE trainer under
torchrun (gloo) sends with one sender per pipeline stage and per expert-parallel rank, each over its own named
weight-update group that the server joined (`init_weights_update_group` with `group_name`), all senders at once;
each `update_weights_from_distributed` call carries one group's bucket. At PP2, EP2 (2 ranks) and PP2xEP2
(4 ranks) the server's weights after the sync (SHA-256 of every parameter, `/weights_checker`) equal, bit for bit,
its weights after the trainer's single-sender export of the same weights was pushed over one group; the version
is the sync's. A sender killed before its bucket 1 (forced by a hook) makes the update raise within the deadline
naming the sender, bucket and tensor; the server keeps its version and generates on. Two servers (a second one for
the last tests): every server takes the groups' buckets in the one shared order, so an EP2 sync (a stage leader and
an expert sender that share the stage's gathers) reaches both bit-exact against the one-sender push, and a killed
sender leaves both at their version, generating on (tests/sglang_support/real_server.py)."""

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


@pytest.fixture(scope="module")
def second_server(server):
    from tests.sglang_support.real_server import launch

    srv = launch(server[0], pause_mode="in_place")
    yield srv
    srv.stop()
    assert srv.proc.poll() is not None


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


def _killed_sender(servers):
    """Two senders into `servers` (this process and a spawned one, SIGKILLed before its bucket 1): the update
    raises within the deadline naming the sender, bucket and tensor; every server keeps its version and generates."""
    import time

    from scalerl_mega.types import Prompt, SamplingParams
    from scalerl_mega.weight_sync import WeightSyncError, spec_of
    from scalerl_mega.weight_sync.plan import plan_buckets
    from tests.integration.test_multi_sync_local import BUCKET, _sync
    from tests.sglang.test_real_qwen3 import checkpoint_tensors, weights
    from tests.sglang_support.oracle import collect
    from tests.sglang_support.real_server import engine_for

    engine = engine_for(*servers, pause_mode="in_place")
    try:
        before = [c.model_info()["weight_version"] for c in engine._ctl_clients]
        named = checkpoint_tensors(weights("qwen3_moe", 3))
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError) as err:
            _sync(engine, None, version=7, tag=f"kill{len(servers)}s", kill_at=1, named=named)
        elapsed = time.monotonic() - t0
        first_b1 = plan_buckets([spec_of(n, t) for n, t in named[len(named) // 2:]], bucket_bytes=BUCKET)[1][0].name
        msg = str(err.value)
        assert f"sender 'kill{len(servers)}sv7-b' bucket 1" in msg and repr(first_b1) in msg, msg
        assert "keep version v0" in msg, msg
        assert elapsed < 3 * engine.config.sync.timeout_s, elapsed  # the bucket's deadline, plus start-up; no hang
        assert engine.version == 0 and [c.model_info()["weight_version"] for c in engine._ctl_clients] == before
        for i in range(len(servers)):  # the servers resumed: the prompts complete after the failed update
            engine.submit(Prompt(prompt_id=f"after{i}", text="", task="synthetic", gold="0", token_ids=[5, 6, 7]),
                          SamplingParams(max_new_tokens=4, temperature=1.0, seed=1), n=1, version=0)
        assert all(len(c.output_ids) == 4 for c in collect(engine, len(servers)))
    finally:
        engine.close()


@pytest.mark.timeout(900)
def test_a_killed_sender_raises_within_the_deadline_and_the_server_generates_on(server):
    _killed_sender([server[1]])


@pytest.mark.timeout(1500)
def test_ep2_senders_into_two_servers_bit_exact_on_real_sglang(server, second_server, tmp_path):
    """Each group holds its sender and both servers (ranks 1 and 2 of 3); both servers walk the one receiving order
    (the stage leader's and the expert sender's buckets by export position), so neither waits on the other."""
    path, srv = server
    report = _launch(tmp_path, ["ep2"], nproc=2, hf=path,
                     extra=["--sglang-url", f"{srv.url},{second_server.url}", "--group-prefix", "two",
                            "--shift-offset", "7"])  # the first server already holds shifts 1-2 (earlier tests)
    r, sent = _check_server(report, path, "ep2", senders=2, version=1)
    assert len(r["engine_digests"]) == 2
    for after_sync, after_push in zip(r["engine_digests"], r["ref_digests"]):
        assert after_sync == after_push  # each server: multi-sender sync == one-sender push, bit for bit
    assert r["engine_digests"][0] == r["engine_digests"][1]


@pytest.mark.timeout(1200)
def test_a_killed_sender_into_two_servers_leaves_both_at_their_version(server, second_server):
    _killed_sender([server[1], second_server])
