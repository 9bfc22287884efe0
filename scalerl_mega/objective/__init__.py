"""The ScaleRL objective (paper Sec. 2, 3.2, 4; App. A.2, A.10, A.11): pure torch math, no I/O.

Modules: `advantages` (Â, normalization, zero-variance filter), `losses` (CISPO, DAPO, GRPO, GSPO with
prompt/sample/token aggregation), `length` (forced interruption, DAPO overlong penalty),
`is_correction` (train-vs-generator truncated / masked IS weights, token or sequence level),
`fused_logprob` (chunked FP32 LM-head log-probs and the fused CISPO path, vocab-parallel variant),
`triton/` (the same fused kernel for GPUs), `names` (the loss and aggregation names, torch-free). Import the
submodules directly; nothing is imported here.
"""
