"""Test-only stand-in on the PYTHONPATH of a CPU SGLang server that serves LoRA adapters (never in the package).

SGLang 0.5.23's LoRA layers and memory pool ask for pinned host memory unconditionally (`srt/lora/layers.py`,
`srt/lora/lora.py`); without an accelerator torch refuses ("Found no NVIDIA driver") and the server dies at
start-up (sgl-project/sglang#31894, closed unfixed). With no accelerator present, the tensor constructors drop
their `pin_memory` argument and `Tensor.pin_memory` returns the tensor itself; nothing changes where one is."""

import functools

import torch

if not torch.cuda.is_available():

    def _drop_pin(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            k.pop("pin_memory", None)
            return fn(*a, **k)

        return wrapper

    for _n in ("tensor", "empty", "zeros", "ones", "arange", "full", "as_tensor", "empty_like", "zeros_like"):
        setattr(torch, _n, _drop_pin(getattr(torch, _n)))
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    torch.Tensor.is_pinned = lambda self, *a, **k: False
