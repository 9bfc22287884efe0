"""A custom reward with a common bug (tests/faults/test_reward_errors_run.py): it parses the completion as a
number, which raises on every real completion."""


def score(completion: str, gold: str, **kwargs: float) -> float:
    return float(completion)
