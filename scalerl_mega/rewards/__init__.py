"""Verifiable rewards (paper App. A.3): math answers via math-verify, code via sandboxed tests.

Modules: `result` (RewardResult), `deadline` (hard timeouts in a forked child), `math`, `sandbox`
(process isolation), `code`, `pool` (batched scoring in worker processes, the `RewardFn` seam).
"""
