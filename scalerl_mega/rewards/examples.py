"""Example custom rewards for `reward.custom` (conf/reward/custom_example.yaml; rewards/custom.py).

A custom reward is any importable function `fn(completion: str, gold, **kwargs)` returning a bool,
a number, a (reward, passed) pair or a RewardResult; it runs in the reward worker processes.
"""

from __future__ import annotations

import re


def last_number_matches(completion: str, gold, *, tolerance: float = 0.0, length_penalty: float = 0.0):
    """Passed when the last number in the completion equals `gold` (within `tolerance`); the reward is
    +1 / -1 minus `length_penalty` per 100 characters (a shaped reward, to show a numeric return)."""
    nums = re.findall(r"-?\d+(?:\.\d+)?", completion.replace(",", ""))
    try:
        passed = bool(nums) and abs(float(nums[-1]) - float(gold)) <= tolerance
    except ValueError:
        passed = False
    reward = (1.0 if passed else -1.0) - length_penalty * len(completion) / 100.0
    return reward, passed
