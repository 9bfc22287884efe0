"""Synthetic verifiable tasks for the CPU embedded default (reference/DEMO_CALIBRATION.md)."""
