"""Per-step statistics of the completions trained on: reward, pass rate, truncation, staleness.

Staleness (paper Sec. 3.1, PipelineRL-k): a sample used at trainer step s that was admitted at
version a has staleness s - a; PipelineRL-k guarantees s - a <= k. Token lag is s minus the
version that produced each token (a completion spans several versions under in-flight updates).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from scalerl_mega.types import FinishReason, Group


def staleness_histogram(groups: Sequence[Group], *, step: int) -> dict[int, int]:
    """{staleness: number of samples} for samples used at trainer step `step`."""
    hist: Counter[int] = Counter()
    for g in groups:
        for s in g.samples:
            hist[step - s.completion.submitted_version] += 1
    return dict(sorted(hist.items()))


def tokens_per_version(groups: Sequence[Group]) -> dict[int, int]:
    """{weight version: number of generated tokens it produced}."""
    counts: Counter[int] = Counter()
    for g in groups:
        for s in g.samples:
            counts.update(s.completion.weight_versions)
    return dict(sorted(counts.items()))


def rollout_metrics(groups: Sequence[Group], *, step: int) -> dict[str, float]:
    """Scalar metrics of one step's groups (before any filtering)."""
    samples = [s for g in groups for s in g.samples]
    n = len(samples)
    if n == 0:
        raise ValueError("rollout_metrics: no samples")
    lengths = [s.completion.num_tokens for s in samples]
    hist = staleness_histogram(groups, step=step)
    mixed = sum(1 for s in samples if len(set(s.completion.weight_versions)) > 1)
    lags = [step - v for s in samples for v in s.completion.weight_versions]
    return {
        "reward_mean": sum(s.reward for s in samples) / n,
        "pass_rate": sum(1.0 for s in samples if s.passed) / n,
        "truncation_rate": sum(1.0 for s in samples if s.completion.finish_reason == FinishReason.LENGTH) / n,
        "interruption_rate": sum(
            1.0 for s in samples
            if s.completion.finish_reason == FinishReason.INTERRUPTED or s.completion.interrupted_at is not None
        ) / n,
        "response_length_mean": sum(lengths) / n,
        "response_length_max": float(max(lengths)),
        "generated_tokens": float(sum(lengths)),
        "staleness_max": float(max(hist)),
        "staleness_mean": sum(k * v for k, v in hist.items()) / n,
        "token_lag_mean": sum(lags) / len(lags) if lags else 0.0,
        "samples_multi_version": float(mixed),
        "prompts": float(len(groups)),
        "samples": float(n),
    }


def domain_key(domain: str) -> str:
    """The validation metric of one domain (paper Sec. 5: separate math and code curves)."""
    return f"val/{domain}_pass_rate"
