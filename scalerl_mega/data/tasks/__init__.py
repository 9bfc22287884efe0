"""Synthetic verifiable tasks for the CPU embedded default (sizes in conf/experiment/demo.yaml)."""
