"""`torchrun --nproc-per-node 2 -m scalerl_mega.train` on `tiny_dense`, TP2+SP, PP2 and DP2: one RL
loop on the controller (rank 0), both ranks training (trainer/ranks.py). Each run trains the same
prompts in the same order as the 1-rank run, with the same samples and rewards, per-step loss and
grad norm within `multirank_util.REL_TOL`, and the weights the engine received at the last push are
bit-identical to a single-process export of the same (resharded) checkpoint."""

from __future__ import annotations

import pytest

from multirank_util import COMMON, assert_same_run, convert, hf_digest, records, run_job, warm_hf_checkpoint

DENSE = ["model=demo_dense"]  # demo widths (4 x 128)
STEPS = ["sft.steps=0", "train.steps=3", "train.save_every=3", "metrics.weights_digest=true"]


@pytest.fixture(scope="module")
def dense_init(tmp_path_factory):
    return warm_hf_checkpoint(tmp_path_factory.mktemp("dense_init"), DENSE)


@pytest.fixture(scope="module")
def dense_single(tmp_path_factory, dense_init):
    out = tmp_path_factory.mktemp("dense_1rank")
    run_job(out, [*COMMON, *DENSE, *STEPS, f"init_from_hf={dense_init}"])
    return records(out)


@pytest.mark.parametrize("layout", [
    pytest.param(["parallel.tp=2", "parallel.sequence_parallel=true"], marks=pytest.mark.compat),  # make test-compat
    pytest.param(["parallel.pp=2"], marks=pytest.mark.slow),  # PP2 and DP2: make test-slow (CI's time; the trainer's
    pytest.param([], marks=pytest.mark.slow),  # own PP2 / DP2 equality is test_megatron_parallel.py's, on both pins)
], ids=["tp2_sp", "pp2", "dp2"])
def test_two_ranks_match_one(tmp_path, dense_init, dense_single, layout):
    out = tmp_path / "run"
    run_job(out, [*COMMON, *DENSE, *STEPS, f"init_from_hf={dense_init}", *layout], nproc=2)
    multi = records(out)
    assert_same_run(dense_single, multi)
    # compute counts each device once: 2 trainer ranks + 1 engine
    assert multi[-1]["compute_device_hours"] == pytest.approx(3 * multi[-1]["wall_hours"], rel=1e-4)
    # what the engine received at the last push == a 1-process export of the saved weights
    assert multi[-1]["gen/weights_version"] == 3.0
    convert(out / "checkpoints", tmp_path / "hf")
    assert hf_digest(tmp_path / "hf") == multi[-1]["gen/weights_sha256"]
    assert "- trainer ranks: 2" in (out / "report.md").read_text()


@pytest.mark.slow
def test_four_ranks_tp2_dp2_match_one(tmp_path, dense_init, dense_single):
    out = tmp_path / "run"
    run_job(out, [*COMMON, *DENSE, *STEPS, f"init_from_hf={dense_init}", "parallel.tp=2",
                  "parallel.sequence_parallel=true"], nproc=4, timeout=900)
    multi = records(out)
    assert_same_run(dense_single, multi)
    assert multi[-1]["compute_device_hours"] == pytest.approx(5 * multi[-1]["wall_hours"], rel=1e-4)
    convert(out / "checkpoints", tmp_path / "hf")
    assert hf_digest(tmp_path / "hf") == multi[-1]["gen/weights_sha256"]
