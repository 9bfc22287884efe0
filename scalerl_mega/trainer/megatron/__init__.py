"""Megatron-Core trainer: config, parallel init (+ CPU compat), models, step, checkpointing.

Nothing heavy is imported here; import the submodules you need.
"""
