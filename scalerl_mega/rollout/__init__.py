"""Rollout engines: the local HF-transformers engine, the SGLang HTTP client, and weight sync.

Nothing heavy is imported here; import the submodules you need (`local`, `sglang`, `weight_sync`).
"""
