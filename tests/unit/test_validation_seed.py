"""The validation sampling seed (validation.validation_seed): independent draws per run seed unless paired."""

from __future__ import annotations

from scalerl_mega.heldout import validation_seed


def test_paired_draws_keep_the_old_seed_for_every_run():
    for run_seed in (0, 1, 7):
        assert validation_seed(version=3, index=5, run_seed=run_seed, paired=True) == 10_000_019 * 4 + 1000 * 5


def test_run_seed_gives_independent_draws():
    seeds = {validation_seed(version=v, index=i, run_seed=s, paired=False)
             for v in (0, 1, 50) for i in (0, 1, 199) for s in (0, 1, 2)}
    assert len(seeds) == 27  # every (version, prompt, run seed) has its own stream
    a = validation_seed(version=3, index=5, run_seed=1, paired=False)
    assert a == validation_seed(version=3, index=5, run_seed=1, paired=False)  # same seed: same draws (paired by seed)
    assert a != validation_seed(version=3, index=5, run_seed=2, paired=False)
    assert a != validation_seed(version=3, index=5, run_seed=1, paired=True)
    # sample i of a prompt uses seed + i (router.sampling_params): streams of prompts 1000 apart do not collide
    # within one run, and the seeds stay in int64 (the engines' torch.long seed tensors)
    assert 0 <= a and a + 16 < 2**63
    assert a == (10_000_019 * 4 + 1000 * 5 + 2 * 0x9E3779B97F4A7C15) % (1 << 62)
