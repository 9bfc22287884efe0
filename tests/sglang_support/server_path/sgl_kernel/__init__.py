"""Stand-in for the one `sgl_kernel` CPU op SGLang 0.5.23's CPU serving path calls (test tooling only).

SGLang's CPU kernels live in `sgl-kernel/csrc/cpu` (C++ built with -march=native for AMX/AVX-512) and
PyPI ships no CPU build of sgl-kernel. With `SGLANG_USE_CPU_ENGINE=1` on a CPU without AMX every
kernel SGLang gates on `cpu_has_amx_support()` runs its plain-torch `forward_native`; the only op it
calls unconditionally while serving is `assign_req_to_token_pool_cpu` (on every batch). This module
provides that op in plain torch, so SGLang itself runs unmodified. It sits on the SGLang server's
PYTHONPATH only (tests/sglang_support/server_path), never on the trainer's.

The other names SGLang imports from `sgl_kernel` at module level on that path (listed at the end)
exist here only so those imports succeed; they raise NotImplementedError if ever called.
"""

from __future__ import annotations

import torch

__version__ = "0.0.0+scalerl-cpu-stand-in"


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, max_len: int) -> None:
    """For each request i, write the next `end_offset[i] - start_offset[i]` entries of `out_cache_loc`
    (consumed in order across requests) into row `req_pool_indices[i]` of `req_to_token`, columns
    `start_offset[i]:end_offset[i]` (in place). `max_len` is the row length (unused: rows are indexed)."""
    pos = 0
    for row, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = e - s
        req_to_token[row, s:e] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


def _not_shipped(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: not provided by the CPU test stand-in "
                                  "(tests/sglang_support/server_path/sgl_kernel)")

    op.__name__ = name
    return op


# Imported at module level under `is_cpu()` (SGLang 0.5.23: kernels/ops/kvcache/cache_move.py and the
# speculative-decoding modules kernels/ops/speculative/{spec_tree,cache_locs,eagle,multi_layer_eagle}.py);
# never called while serving without speculative decoding.
for _name in ("copy_all_layer_kv_cache_cpu", "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu",
              "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
              "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu", "rotate_input_ids_cpu"):
    globals()[_name] = _not_shipped(_name)
del _name
