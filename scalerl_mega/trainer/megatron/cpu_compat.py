"""CPU compatibility layer for megatron-core 0.16.1 .. 0.19.2 (failures 1-12 below).

Megatron-Core's training path runs on CPU over gloo except for the places below that assume CUDA.
Each is fixed here by the narrowest change found, listed failure by failure. Where the releases
differ (failures 3, 4 and 11), `mcore_compat` says which targets the installed release has; a
patch whose failure the release does not have is not installed. On a CUDA build of torch on a
machine without a GPU (the default torch wheel for Python 3.12) the same calls fail with
"Found no NVIDIA driver on your system" instead of "Torch not compiled with CUDA enabled".

1. `torch.cuda.current_device()` raises "Torch not compiled with CUDA enabled" (~100 calls, e.g.
   RotaryEmbedding, router init, DDP buffers). Fix: that one function returns "cpu". It is replaced
   only on builds where it can only raise, so no working behaviour changes.
2. `CudaRNGStatesTracker.add` calls `torch.cuda.get_rng_state()`. Fix: `initialize_rng_tracker` (the
   single place Megatron creates its tracker) installs `CpuRNGStatesTracker`, a subclass whose
   add/fork keep named CPU generator states. `model_parallel_cuda_manual_seed` then works unchanged.
3. Literal `device="cuda"` allocations (causal mask, `total_num_tokens` in the schedules, clip-grads
   buffers, optimizer scale tensors, MoE aux-loss tracker <= 0.17, the grad-norm-group flag of
   `MegatronOptimizer.has_grad_norm_group` >= 0.19). Fix: only these functions run inside a
   scoped `TorchFunctionMode` that maps cuda devices to cpu, makes `Tensor.cuda()` a no-op and drops
   `pin_memory`. The mode is active only for the duration of a wrapped call, never globally.
4. MoE router: `NameError: name 'te_general_gemm' is not defined` (moe_utils, a bug when TE is
   absent). Fix: define `moe_utils.te_general_gemm = None`, the value the TE-present branch tests for.
5. alltoall dispatcher: `torch.cuda.Stream requires CUDA support` (device-to-host side stream).
   Fix: the dispatcher's `__init__` and `_maybe_dtoh_and_synchronize` run with a stand-in stream
   (`torch.cuda.Stream/current_stream/stream/synchronize` swapped only for the duration of those
   two methods). The same stand-ins cover `torch.cuda.synchronize()` in dist-checkpointing's
   `FileSystemWriterAsync.preload_tensors` ("Torch not compiled with CUDA enabled" on every save)
   and in the pipeline's `P2PCommunicator._communicate_shapes` (micro-batches of different shapes:
   `variable_seq_lengths`, set by step.py under PP). (Pipeline p2p also calls
   `torch.cuda.synchronize()` after batched isend/irecv; that is avoided without a patch:
   `models.transformer_config` sets `batch_p2p_sync=False` on CPU.)
6. Optimizer dtype checks `param.grad.type() == 'torch.cuda.FloatTensor'` (clip_grads, distributed
   optimizer param groups) fail with a bare AssertionError. Fix: inside the same scoped mode as 3,
   `Tensor.type()` without arguments reports the cuda type name. Only the functions that perform
   those checks (clip-grad helpers, optimizer constructors) are wrapped.
7. Sequence parallelism with the local (non-TE) spec: `WrappedTorchNorm` asserts "sequence parallel
   not supported by torch LayerNorm". Fix: `SequenceParallelTorchNorm`, a drop-in norm class used by
   `models.py` in the local spec (no patching): it builds the same torch norm and tags its weights
   `sequence_parallel=True` so `finalize_model_grads` all-reduces their grads over TP.
8. EP>1 with the alltoall dispatcher: `all_to_all_single(): incompatible function arguments` because
   `maybe_move_tensor_to_cpu(..., as_numpy=True)` converts split sizes only for cuda tensors. Fix: a
   wrapper that also converts CPU tensors when `as_numpy=True`, installed in moe_utils and in
   token_dispatcher (which imported the name).

9. Activation recompute (`tensor_parallel.checkpoint`, used by `recompute_granularity` selective and
   full) saves and restores the CUDA RNG state with `_get_cuda_rng_state`/`_set_cuda_rng_state`
   ("Torch not compiled with CUDA enabled"). There is no CUDA generator on a CPU build; the CPU
   generator and the model-parallel tracker states are saved/restored by the same functions already.
   Fix: those two return None / do nothing.
10. bf16 mixed precision: `Float16OptimizerWithFloat16Params.__init__` allocates its unit loss scale
   `_scale_one` with `device="cuda"` (as in 3) and checks `param.type() in ['torch.cuda.HalfTensor',
   'torch.cuda.BFloat16Tensor']` (as in 6). Fix: its constructor runs in the scoped mode of 3/6.
11. megatron-core >= 0.17: DDP's `_ParamAndGradBucketGroup.start_grad_sync` waits on
   `torch.cuda.current_stream()` for CUDA-graph events before every gradient reduction. Fix: it runs
   with the stand-in streams of 5 (no parameter carries such an event on CPU, so nothing is waited on).
12. Tied embeddings with PP > 1 (Qwen3-0.6B, Llama-3.2-1B): `LanguageModule.setup_embeddings_and_output_layer`
   moves the last stage's copy of the word embedding to CUDA (`weight.data.cuda()`) before the all-reduce
   over the embedding group that makes both copies equal. Fix: the method runs in the scoped mode of 3.

`apply()` is idempotent and does nothing when CUDA is available. `revert()` restores every original
(tests use it to reproduce each failure). Every replaced callable carries `__scalerl_cpu_compat__`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

_MARK = "__scalerl_cpu_compat__"


# ----------------------------------------------------------------------------- scoped mode (3, 6)
def _is_cuda_device(device: object) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


def _cuda_to_cpu_mode():
    """TorchFunctionMode: cuda devices -> cpu, `.cuda()`/`.pin_memory()` no-ops, cuda type names."""
    import torch
    from torch.overrides import TorchFunctionMode

    cuda_names = {"torch.FloatTensor": "torch.cuda.FloatTensor", "torch.HalfTensor": "torch.cuda.HalfTensor",
                  "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor", "torch.IntTensor": "torch.cuda.IntTensor",
                  "torch.LongTensor": "torch.cuda.LongTensor", "torch.DoubleTensor": "torch.cuda.DoubleTensor"}

    class CudaToCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in (torch.Tensor.cuda, torch.Tensor.pin_memory):
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args).replace("torch.meta.", "torch.")  # meta: the dry run's tensors
                return cuda_names.get(name, name)
            if "device" in kwargs and _is_cuda_device(kwargs["device"]):
                kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
                args = (args[0], "cpu", *args[2:])
            return func(*args, **kwargs)

    return CudaToCpu()


class _FakeEvent:
    """Stand-in for a CUDA event on CPU: work is synchronous, so an event is always complete."""

    def synchronize(self) -> None:
        pass

    def wait(self, stream: _FakeStream | None = None) -> None:
        pass

    def record(self, stream: _FakeStream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True


class _FakeStream:
    """Stand-in for a CUDA stream on CPU: every operation is synchronous, so waits are no-ops."""

    def wait_stream(self, other: _FakeStream) -> None:
        pass

    def wait_event(self, event: _FakeEvent) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: _FakeEvent | None = None) -> _FakeEvent:
        return event if event is not None else _FakeEvent()


_FAKE_STREAM = _FakeStream()


@contextlib.contextmanager
def _fake_cuda_streams() -> Iterator[None]:
    import torch

    saved = (torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream, torch.cuda.synchronize)
    torch.cuda.Stream = lambda *a, **k: _FAKE_STREAM  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *a, **k: _FAKE_STREAM  # type: ignore[assignment]
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream, torch.cuda.synchronize = saved


def _scoped(fn: Callable[..., Any] | staticmethod, scope: Callable[[], Any]) -> Any:
    if isinstance(fn, staticmethod):
        wrapped = staticmethod(_scoped(fn.__func__, scope))
        setattr(wrapped, _MARK, True)
        return wrapped

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with scope():
            return fn(*args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper


# ----------------------------------------------------------------------------- RNG tracker (2)
def _cpu_tracker_class():
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Named RNG streams on the CPU default generator (same API as CudaRNGStatesTracker)."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


# ----------------------------------------------------------------------------- patch registry
_Targets = list[tuple[Any, str, Callable[[Any], Any]]]
"""(owner, attribute, make_replacement(original)) triples of one patch."""


@dataclass
class _Patch:
    number: int
    failure: str
    targets: Callable[[], _Targets]
    """Returns the patch's (owner, attribute, make_replacement(original)) triples."""
    needed: Callable[[], bool] = lambda: True
    """Whether the installed megatron-core has this failure at all (mcore_compat)."""


def _targets_1() -> _Targets:
    import torch

    def current_device():
        return "cpu"

    return [(torch.cuda, "current_device", lambda orig: current_device)]


def _targets_2() -> _Targets:
    from megatron.core.tensor_parallel import random as mrandom

    tracker_cls = _cpu_tracker_class()

    def make(orig):
        def initialize_rng_tracker(use_te_rng_tracker=False, inference_rng_tracker=False,
                                   use_cudagraphable_rng=False, force_reset=False):
            if force_reset or not mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED:
                mrandom._CUDA_RNG_STATE_TRACKER = tracker_cls()
                mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

        return initialize_rng_tracker

    return [(mrandom, "initialize_rng_tracker", make)]


def _targets_3() -> _Targets:
    from megatron.core.fusions import fused_softmax
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer.moe import moe_utils, router

    from scalerl_mega.trainer.megatron import mcore_compat

    scoped = lambda orig: _scoped(orig, _cuda_to_cpu_mode)  # noqa: E731
    targets = [
        (fused_softmax, "get_default_causal_mask", scoped),
        (schedules, "forward_backward_no_pipelining", scoped),
        (schedules, "forward_backward_pipelining_without_interleaving", scoped),
        (schedules, "forward_backward_pipelining_with_interleaving", scoped),
        (moe_utils, "save_to_aux_losses_tracker", scoped),
    ]
    if mcore_compat.router_saves_aux_losses_through_moe_utils():
        targets.append((router, "save_to_aux_losses_tracker", scoped))
    if mcore_compat.optimizer_has_grad_norm_groups():
        from megatron.core.optimizer import optimizer

        targets.append((optimizer.MegatronOptimizer, "has_grad_norm_group", scoped))
    return targets


def _targets_4() -> _Targets:
    from megatron.core.transformer.moe import moe_utils

    return [(moe_utils, "te_general_gemm", lambda orig: None)]


def _targets_5() -> _Targets:
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync as W
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator as P
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as D

    scoped = lambda orig: _scoped(orig, _fake_cuda_streams)  # noqa: E731
    return [(D, "__init__", scoped), (D, "_maybe_dtoh_and_synchronize", scoped),
            (W, "preload_tensors", scoped), (P, "_communicate_shapes", scoped)]


def _targets_6() -> _Targets:
    from megatron.core.optimizer import distrib_optimizer, optimizer

    scoped = lambda orig: _scoped(orig, _cuda_to_cpu_mode)  # noqa: E731
    return [
        (optimizer, "get_grad_norm_fp32", scoped),
        (optimizer, "clip_grad_by_total_norm_fp32", scoped),
        (optimizer, "count_zeros_fp32", scoped),
        (optimizer.FP32Optimizer, "__init__", scoped),
        (distrib_optimizer.DistributedOptimizer, "__init__", scoped),
    ]


def _targets_9() -> _Targets:
    from megatron.core.tensor_parallel import random as mrandom

    def get_state(*args, **kwargs):
        return None

    def set_state(*args, **kwargs):
        return None

    return [(mrandom, "_get_cuda_rng_state", lambda orig: get_state),
            (mrandom, "_set_cuda_rng_state", lambda orig: set_state)]


def _targets_10() -> _Targets:
    from megatron.core.optimizer import optimizer

    scoped = lambda orig: _scoped(orig, _cuda_to_cpu_mode)  # noqa: E731
    return [(optimizer.Float16OptimizerWithFloat16Params, "__init__", scoped)]


def _targets_11() -> _Targets:
    from scalerl_mega.trainer.megatron import mcore_compat

    scoped = lambda orig: _scoped(orig, _fake_cuda_streams)  # noqa: E731
    return [(mcore_compat.grad_bucket_group_class(), "start_grad_sync", scoped)]


def _targets_12() -> _Targets:
    from megatron.core.models.common.language_module.language_module import LanguageModule

    return [(LanguageModule, "setup_embeddings_and_output_layer", lambda orig: _scoped(orig, _cuda_to_cpu_mode))]


def _targets_8() -> _Targets:
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def make(orig):
        import torch

        def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
            if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
                return tensor.numpy()
            return orig(tensor, as_numpy=as_numpy, record_stream=record_stream)

        return maybe_move_tensor_to_cpu

    return [(moe_utils, "maybe_move_tensor_to_cpu", make),
            (token_dispatcher, "maybe_move_tensor_to_cpu", make)]


def _patches() -> list[_Patch]:
    from scalerl_mega.trainer.megatron import mcore_compat

    return [
        _Patch(1, "torch.cuda.current_device: Torch not compiled with CUDA enabled", _targets_1),
        _Patch(2, "CudaRNGStatesTracker.add: torch.cuda.get_rng_state", _targets_2),
        _Patch(3, "literal device='cuda' allocations", _targets_3),
        _Patch(4, "moe_utils: name 'te_general_gemm' is not defined", _targets_4,
               needed=lambda: not mcore_compat.moe_utils_defines_te_general_gemm()),
        _Patch(5, "token_dispatcher: torch.cuda.Stream requires CUDA support", _targets_5),
        _Patch(6, "param.grad.type() == 'torch.cuda.FloatTensor'", _targets_6),
        # 7 is not a patch: see SequenceParallelTorchNorm (used by models.py).
        _Patch(8, "all_to_all_single(): incompatible function arguments (tensor split sizes)", _targets_8),
        _Patch(9, "activation recompute: CUDA RNG state get/set", _targets_9),
        _Patch(10, "Float16OptimizerWithFloat16Params: param.type() == 'torch.cuda.BFloat16Tensor'", _targets_10),
        _Patch(11, "DDP start_grad_sync: torch.cuda.current_stream()", _targets_11,
               needed=mcore_compat.grad_sync_uses_cuda_streams),
        _Patch(12, "tied embeddings with PP > 1: LanguageModule.setup_embeddings_and_output_layer .cuda()", _targets_12),
    ]


_MISSING = object()


def _mark(value: object) -> object:
    if callable(value):
        try:
            setattr(value, _MARK, True)
        except (AttributeError, TypeError):
            pass
    return value


def _is_marked(owner: object, attr: str) -> bool:
    """Installed iff the owner itself keeps the original (patch 4 installs None, which carries no mark)."""
    return f"_scalerl_orig_{attr}" in vars(owner)


def needed() -> bool:
    """True on machines without CUDA (the only case where the layer is applied)."""
    import torch

    return not torch.cuda.is_available()


def apply(*, only: tuple[int, ...] | None = None, force: bool = False) -> list[int]:
    """Install the patches (all, or the numbers in `only`). Idempotent; no-op with CUDA unless `force`.

    Returns the patch numbers installed by this call.
    """
    if not (force or needed()):
        return []
    installed = []
    for patch in _patches():
        if (only is not None and patch.number not in only) or not patch.needed():
            continue
        changed = False
        for owner, attr, make in patch.targets():
            if _is_marked(owner, attr):
                continue
            original = owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr, _MISSING)
            replacement = _mark(make(None if original is _MISSING else original))
            setattr(owner, f"_scalerl_orig_{attr}", original)
            setattr(owner, attr, replacement)
            changed = True
        if changed:
            installed.append(patch.number)
    return installed


def revert(*, only: tuple[int, ...] | None = None) -> list[int]:
    """Restore the originals of installed patches (for tests reproducing the failures)."""
    reverted = []
    for patch in _patches():
        if only is not None and patch.number not in only:
            continue
        changed = False
        for owner, attr, _ in patch.targets():
            if not _is_marked(owner, attr):
                continue
            original = getattr(owner, f"_scalerl_orig_{attr}")
            if original is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
            delattr(owner, f"_scalerl_orig_{attr}")
            changed = True
        if changed:
            reverted.append(patch.number)
    return reverted


def installed() -> list[int]:
    """Numbers of the patches currently installed."""
    return [p.number for p in _patches() if all(_is_marked(o, a) for o, a, _ in p.targets()) and p.needed()]


def applicable() -> list[int]:
    """Numbers of the patches the installed megatron-core needs on CPU (mcore_compat)."""
    return [p.number for p in _patches() if p.needed()]


# ----------------------------------------------------------------------------- failure 7
class SequenceParallelTorchNorm:
    """Local-spec norm that accepts `sequence_parallel=True` (failure 7).

    Builds the same torch norm as `WrappedTorchNorm` (from a config copy with SP off) and tags
    the weights `sequence_parallel=True`: with SP each TP rank normalises a different slice of the
    sequence, so the weight gradients are partial sums that `finalize_model_grads` all-reduces.
    """

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        sp = bool(config.sequence_parallel)
        if sp:
            config = copy.copy(config)
            config.sequence_parallel = False
        norm = WrappedTorchNorm(config, hidden_size, eps=eps, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = sp
        return norm
