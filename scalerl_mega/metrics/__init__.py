"""Metrics: metrics.jsonl + TensorBoard writer, compute accounting, rollout statistics, console line."""
