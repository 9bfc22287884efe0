"""Multi-sender weight sync from a Megatron Qwen3-MoE trainer under torchrun (gloo, CPU) to the
local engine: one sender per pipeline stage and per expert-parallel rank, each over its own named group,
all at once. After each sync the engine's weights equal the trainer's single-sender export bit for
bit (SHA-256 over every tensor), at PP2 and EP2 (2 ranks) and PP2xEP2 (4 ranks); the senders' bytes add
up to the plan and no expert-parallel rank holds another rank's experts. PP2 and EP2 sync into two engines
(`build.EngineSet`): every sender broadcasts to both at once and both end bit-exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _launch(tmp_path, layouts, *, nproc, extra=(), hf=None):
    """Run the worker at `layouts` on `nproc` ranks; `hf`: the trainer's checkpoint (default: a tiny
    Qwen3-MoE written here, and another seed's for the local engine)."""
    from scalerl_mega.convert.tiny import save_tiny_hf

    eng = str(tmp_path / "engine_hf")
    if hf is None:
        hf = str(tmp_path / "hf")
        if not os.path.exists(hf):
            save_tiny_hf("qwen3_moe", hf, seed=0)
            save_tiny_hf("qwen3_moe", eng, seed=1)
    out = str(tmp_path / f"report{nproc}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           os.path.join(ROOT, "tests", "integration", "multi_sync_worker.py"),
           "--hf-dir", hf, "--engine-hf-dir", eng, "--out", out, "--layouts", *layouts, *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env = dict(env, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    with open(out) as f:
        return json.load(f)


def _check(report, layout, *, senders, hf_config=None):
    """The layout's sync: engine == reference, senders and bytes as planned, every tensor sent once (of the
    model of `hf_config`, a config.json dict; default the tiny Qwen3-MoE)."""
    from scalerl_mega.convert import tables
    from scalerl_mega.convert.dims import dims_from_hf_config
    from scalerl_mega.convert.tiny import tiny_hf_config

    r = report[layout]
    assert r["engine_digest"] == r["ref_digest"] != report["engine_digest_before"], layout
    m = r["metrics"]
    sent = [s for s in r["stats"] if s["group"]]
    assert m["sync/senders"] == senders == len(sent) == len(r["plan_bytes"])
    assert {s["group"]: s["bytes"] for s in sent} == r["plan_bytes"]
    assert m["sync/bytes"] == sum(r["plan_bytes"].values()) and m["sync/max_sender_bytes"] == max(r["plan_bytes"].values())
    dims = dims_from_hf_config(hf_config or tiny_hf_config("qwen3_moe").to_dict())
    names = sorted(n for s in sent for n in s["names"])
    assert names == sorted(tables.hf_names(dims))  # every tensor exactly once over all senders
    return r, sent


@pytest.mark.timeout(900)
def test_pp2_and_ep2_senders_bit_exact_on_two_local_engines(tmp_path):
    """Two engines (`build.EngineSet`): each sender's group holds the sender and both engine processes (ranks
    1 and 2 of 3); one broadcast reaches both, and each applies the version when all its groups finished."""
    report = _launch(tmp_path, ["pp2", "ep2"], nproc=2, extra=["--engines", "2"])
    for layout, version in (("pp2", 1), ("ep2", 2)):
        r, _ = _check(report, layout, senders=2)
        assert r["engine_digests"] == [r["ref_digest"]] * 2 and r["engine_versions"] == [version] * 2
    r, sent = _check(report, "ep2", senders=2)
    # EP2: experts 0-1 on ep rank 0, 2-3 on ep rank 1; each sends only its own (no rank holds all experts)
    by = {s["group"]: s["names"] for s in sent}
    assert not any(".experts.2." in n or ".experts.3." in n for n in by["wu-ep2-pp0"])
    assert all(".experts.2." in n or ".experts.3." in n for n in by["wu-ep2-pp0-ep1"])
    # item 5: the largest rank's transient memory is at most its stage's dense bytes plus one bucket
    # (the dense bytes of the stage: the leader's group without experts; one bucket: --bucket-bytes 16384)
    dense = r["dense_bytes"]["wu-ep2-pp0"]
    assert 0 < dense < r["plan_bytes"]["wu-ep2-pp0"]
    assert 0 < r["metrics"]["sync/max_rank_transient_bytes"] <= dense + 16384


@pytest.mark.timeout(900)
def test_pp2xep2_four_senders_bit_exact_flattened(tmp_path):
    report = _launch(tmp_path, ["pp2ep2"], nproc=4, extra=["--flattened"])
    r, sent = _check(report, "pp2ep2", senders=4)
    for stage in (0, 1):  # each stage's expert sender holds only experts 2-3 of its own stage's layers
        names = next(s["names"] for s in sent if s["group"] == f"wu-pp2ep2-pp{stage}-ep1")
        assert names and all((".experts.2." in n or ".experts.3." in n) and int(n.split(".")[2]) // 2 == stage
                             for n in names)

