"""Triton kernels for the fused FP32 LM-head log-probs (GPU). Import `triton.fused_logprob` explicitly;
nothing (in particular not `triton`) is imported here. On machines without a GPU the torch chunked path
(`objective.fused_logprob`) is the default; these kernels are tested on CPU under TRITON_INTERPRET=1, compiled
for sm_90 without a GPU by `triton.aot`, and checked on a GPU by tests/gpu. `_kernels` holds the JIT code."""
