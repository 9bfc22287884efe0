"""Cluster-side library: memory planner (plan.py), generator/trainer simulator (simulate.py) and
Slurm allocation parsing (allocation.py). Pure Python, no torch, no I/O at import time."""
