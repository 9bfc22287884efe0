"""What a LoRA checkpoint's resume refuses, without Megatron (the multi-rank runs: test_lora_ep_reshard.py):

- a random base's reference (`lora_ckpt.random_base_reference`) carries the pipeline- and (MoE) expert-parallel sizes
  it was drawn under when they are not 1 -- Megatron's CPU initialisation draws each stage's layers and each
  expert-parallel rank's local experts from one seeded stream (measured by hand: tiny_dense at PP 2 draws layer 1
  and the output layer differently from one rank) -- and `check_base` refuses adapters of another draw layout;
- `checkpoint._check_optimizer_kind` refuses optimizer state of the other kind (distributed vs not), naming
  `optim.use_distributed_optimizer`, and lets a checkpoint without the record through.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scalerl_mega.trainer.megatron.checkpoint import _check_optimizer_kind
from scalerl_mega.trainer.megatron.lora_ckpt import check_base, random_base_reference


def _ref(*, pp: int = 1, ep: int = 1, moe: bool = True) -> dict:
    return random_base_reference(seed=7, model_name="m", pp=pp, ep=ep, moe=moe)


def test_random_base_reference_records_only_the_sizes_that_change_the_draw():
    assert _ref() == {"path": "", "seed": 7, "model": "m"}  # as before the record: old checkpoints still match
    assert _ref(ep=2)["drawn_under"] == {"ep": 2}
    assert _ref(ep=2, moe=False) == _ref()  # a dense model has no experts to draw per rank
    assert _ref(pp=2, ep=4)["drawn_under"] == {"pp": 2, "ep": 4}


def test_check_base_refuses_another_draw_layout_and_accepts_the_same():
    check_base(_ref(ep=2), _ref(ep=2), where="ckpt")
    other_seed = random_base_reference(seed=8, model_name="m", pp=1, ep=1, moe=True)
    for saved, now in ((_ref(ep=2), _ref()), (_ref(), _ref(pp=2)), (_ref(ep=2), _ref(ep=4)), (_ref(), other_seed)):
        with pytest.raises(ValueError, match="ckpt: its adapters were trained on the base"):
            check_base(saved, now, where="ckpt")


class DistributedOptimizer:  # optimizer_state.is_distributed reads the class name (Megatron's)
    pass


class ChainedOptimizer:
    def __init__(self, *subs):
        self.chained_optimizers = list(subs)


class Adam:
    pass


def test_optimizer_kind_mismatch_is_refused_both_ways_naming_the_setting():
    ckpt = Path("/ck/step_00000001")
    with pytest.raises(ValueError, match="written by Megatron's distributed optimizer, this run has a "
                                         "non-distributed.*use_distributed_optimizer=true"):
        _check_optimizer_kind(ckpt, True, ChainedOptimizer(Adam()))
    with pytest.raises(ValueError, match="written by a non-distributed optimizer, this run has Megatron's "
                                         "distributed.*use_distributed_optimizer=false"):
        _check_optimizer_kind(ckpt, False, ChainedOptimizer(DistributedOptimizer(), DistributedOptimizer()))


def test_optimizer_of_the_same_kind_or_an_unrecorded_kind_passes():
    _check_optimizer_kind(Path("c"), True, ChainedOptimizer(DistributedOptimizer()))
    _check_optimizer_kind(Path("c"), False, Adam())
    _check_optimizer_kind(Path("c"), None, Adam())  # a checkpoint written before the record
    _check_optimizer_kind(Path("c"), None, DistributedOptimizer())
