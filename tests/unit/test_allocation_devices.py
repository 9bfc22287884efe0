"""Compute C counts every device of the allocation once (paper Sec. 2, App. A.3: 16 trainer + 64
generator GPUs = 80), whatever the engines' TP size."""

from __future__ import annotations

import pytest

from scalerl_mega import build
from scalerl_mega.cluster.launch_config import compose
from scalerl_mega.metrics.compute import allocation_devices


def test_hand_examples():
    # paper layout given as totals: 16 + 64
    assert allocation_devices(trainer_devices=16, generator_devices=64, num_engines=8, devices_per_engine=1) == 80
    # derived from engines: 32 SGLang servers of TP 2 = 64 generator GPUs
    assert allocation_devices(trainer_devices=16, generator_devices=0, num_engines=32, devices_per_engine=2) == 80
    # the CPU demo under torchrun: 2 trainer ranks + 1 local engine
    assert allocation_devices(trainer_devices=2, generator_devices=0, num_engines=1, devices_per_engine=1) == 3
    with pytest.raises(ValueError, match="num_engines=0"):
        allocation_devices(trainer_devices=1, generator_devices=0, num_engines=0, devices_per_engine=1)


def test_paper_layout_counts_80_not_528():
    cfg = compose(["experiment=scalerl"])  # cluster=slurm: 16 trainer + 64 generator GPUs, 8 engines
    assert build.allocation_devices(cfg, world_size=16) == 80
    # the Slurm scripts' Scout layout: 32 servers of TP 2
    cfg = compose(["experiment=scalerl", "model=scout_17b16e", "rollout.num_engines=32", "rollout.sglang_tp_size=2",
                   "cluster.generator_devices=64"])
    assert build.allocation_devices(cfg, world_size=16) == 80


def test_local_cluster_takes_the_world_size():
    cfg = compose(["experiment=demo"])
    assert cfg.cluster.trainer_devices == 0
    assert build.allocation_devices(cfg, world_size=1) == 2
    assert build.allocation_devices(cfg, world_size=2) == 3


def test_an_in_process_engine_shares_the_trainer_device():
    """rollout.in_process (experiment=gpu_check): trainer and engine on one device count it once."""
    cfg = compose(["experiment=gpu_check"])
    assert build.allocation_devices(cfg, world_size=1) == 1
    cfg = compose(["experiment=gpu_check", "rollout.in_process=false"])
    assert build.allocation_devices(cfg, world_size=1) == 2
