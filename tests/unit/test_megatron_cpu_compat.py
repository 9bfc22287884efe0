"""CPU compatibility layer: each patch's target failure is reproduced with the patch reverted and
avoided with it applied (values checked against hand computations). No process group needed.
Patch 5's dispatcher methods and patch 8 inside a real all-to-all are exercised by the
multi-process tests (MoE EP2 alltoall); their building blocks are checked here.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover
    pytest.skip("the CPU compatibility layer is only applied without CUDA", allow_module_level=True)

from scalerl_mega.trainer.megatron import cpu_compat, mcore_compat  # noqa: E402

# A CPU build of torch: "Torch not compiled with CUDA enabled" (AssertionError); a CUDA build on a machine
# without a GPU (the only torch for Python 3.12 here): "Found no NVIDIA driver on your system" (RuntimeError).
CUDA_MSG = "Torch not compiled with CUDA enabled|Found no NVIDIA driver"
NO_CUDA = (AssertionError, RuntimeError)
# The failures of each release, written out by hand (cpu_compat's docstring): 4 is fixed upstream in 0.17,
# 11 appears in 0.17.
ALL = [1, 2, 3, 4, 5, 6, 8, 9, 10, 12] if mcore_compat.version() < (0, 17, 0) else [1, 2, 3, 5, 6, 8, 9, 10, 11, 12]


@pytest.fixture(autouse=True)
def _applied():
    cpu_compat.apply()
    yield
    cpu_compat.apply()  # leave the process patched whatever a test reverted


def test_apply_is_idempotent_and_revert_restores():
    assert cpu_compat.applicable() == ALL
    assert cpu_compat.installed() == ALL
    assert cpu_compat.apply() == []
    assert sorted(cpu_compat.revert()) == ALL
    assert cpu_compat.installed() == []
    from megatron.core.transformer.moe import moe_utils

    # 0.16.1 leaves the name undefined without TE (patch 4 defines it); 0.17+ defines it as None itself
    assert hasattr(moe_utils, "te_general_gemm") == (4 not in ALL)
    assert cpu_compat.apply() == ALL


def test_not_applied_when_cuda_present(monkeypatch):
    cpu_compat.revert()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_compat.apply() == []
    assert cpu_compat.installed() == []


def test_1_current_device_and_rotary_embedding():
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    cpu_compat.revert(only=(1,))
    with pytest.raises(NO_CUDA, match=CUDA_MSG):
        RotaryEmbedding(kv_channels=8, rotary_percent=1.0, rotary_base=10000)(4)
    cpu_compat.apply(only=(1,))
    emb = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, rotary_base=10000)(4)
    inv = [10000 ** (-i / 8) for i in (0, 2, 4, 6)]
    expect = torch.tensor([[p * f for f in inv] * 2 for p in range(4)], dtype=torch.float64)
    assert emb.shape == (4, 1, 1, 8)
    assert torch.allclose(emb.reshape(4, 8).double(), expect, atol=1e-6)


def test_2_rng_tracker_named_cpu_streams():
    from megatron.core.tensor_parallel import random as mrandom

    cpu_compat.revert(only=(2,))
    mrandom.initialize_rng_tracker(force_reset=True)
    with pytest.raises(NO_CUDA, match=CUDA_MSG):
        mrandom.get_cuda_rng_tracker().add("model-parallel-rng", 7)
    cpu_compat.apply(only=(2,))
    mrandom.initialize_rng_tracker(force_reset=True)
    tracker = mrandom.get_cuda_rng_tracker()
    tracker.add("model-parallel-rng", 7)
    torch.manual_seed(0)
    outside_expected = torch.rand(3)
    torch.manual_seed(0)
    with tracker.fork():
        inside = torch.rand(3)
    with tracker.fork():
        inside2 = torch.rand(3)
    g = torch.Generator().manual_seed(7)
    assert torch.equal(inside, torch.rand(3, generator=g))
    assert torch.equal(inside2, torch.rand(3, generator=g))  # the named stream advances
    assert torch.equal(torch.rand(3), outside_expected)  # the default stream is untouched
    mrandom.initialize_rng_tracker(force_reset=True)


def test_3_causal_mask_on_cpu():
    from megatron.core.fusions import fused_softmax

    cpu_compat.revert(only=(3,))
    with pytest.raises((AssertionError, RuntimeError)):
        fused_softmax.get_default_causal_mask(3)
    cpu_compat.apply(only=(3,))
    mask = fused_softmax.get_default_causal_mask(3)
    assert mask.device.type == "cpu"
    assert mask.tolist() == [[False, True, True], [False, False, True], [False, False, False]]


def test_3_mode_is_scoped_to_wrapped_calls():
    from megatron.core.fusions import fused_softmax

    fused_softmax.get_default_causal_mask(2)
    assert torch.ones(1).type() == "torch.FloatTensor"  # type names are not rewritten outside
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


def test_4_router_gating_without_te():
    from megatron.core.transformer.moe import moe_utils

    if 4 not in ALL:  # fixed upstream: the router gating runs on CPU without the patch
        assert cpu_compat.apply(only=(4,)) == [] and moe_utils.te_general_gemm is None
        out = moe_utils.router_gating_linear(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, -1.0]]), None,
                                             torch.float32)
        assert out.tolist() == [[-1.5]]  # 1*0.5 + 2*(-1) by hand
        return

    inp = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    weight = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
    cpu_compat.revert(only=(4,))
    with pytest.raises(NameError, match="te_general_gemm"):
        moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    cpu_compat.apply(only=(4,))
    out = moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    assert out.tolist() == [[-1.5, 2.5], [2.5, 5.75]]  # inp @ weight.T by hand


def test_5_checkpoint_preload_synchronize():
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync as W

    bucket = ("f", "k", ([], [("item", torch.arange(3.0))]))
    stream_cls = torch.cuda.Stream
    cpu_compat.revert(only=(5,))
    with pytest.raises(NO_CUDA, match=CUDA_MSG):
        W.preload_tensors([bucket], non_blocking=True)
    cpu_compat.apply(only=(5,))
    (out,) = W.preload_tensors([bucket], non_blocking=True)
    assert out[2][1][0][1].tolist() == [0.0, 1.0, 2.0]
    assert torch.cuda.Stream is stream_cls  # the stand-ins are not left behind...
    with pytest.raises(RuntimeError):  # ...and the real class still fails without a GPU
        torch.cuda.Stream()


def test_5_pipeline_shape_exchange_synchronize():
    """Micro-batches of different shapes under PP (`variable_seq_lengths`): the shape exchange ends with
    `torch.cuda.synchronize()`. Without anything to exchange it returns zero shapes once patched."""
    from types import SimpleNamespace

    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator as P

    comm = SimpleNamespace(config=SimpleNamespace(use_ring_exchange_p2p=False))
    cpu_compat.revert(only=(5,))
    with pytest.raises(NO_CUDA, match=CUDA_MSG):
        P._communicate_shapes(comm, None, None, False, False)
    cpu_compat.apply(only=(5,))
    assert P._communicate_shapes(comm, None, None, False, False) == ([0, 0, 0], [0, 0, 0])


def test_6_clip_grads_type_check():
    from megatron.core.optimizer import optimizer as mopt

    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3.0, 4.0])
    cpu_compat.revert(only=(6,))
    with pytest.raises(AssertionError):
        mopt.clip_grad_by_total_norm_fp32([p], max_norm=1.0, total_norm=5.0)
    cpu_compat.apply(only=(6,))
    mopt.clip_grad_by_total_norm_fp32([p], max_norm=1.0, total_norm=5.0)
    coeff = 1.0 / (5.0 + 1e-6)
    assert p.grad.tolist() == pytest.approx([3.0 * coeff, 4.0 * coeff], rel=1e-6)


def test_7_sequence_parallel_norm():
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    cfg = types.SimpleNamespace(layernorm_zero_centered_gamma=False, persist_layer_norm=False,
                                sequence_parallel=True, memory_efficient_layer_norm=False,
                                normalization="RMSNorm")
    with pytest.raises(AssertionError, match="sequence parallel not supported"):
        WrappedTorchNorm(cfg, 2, eps=1e-5)
    norm = cpu_compat.SequenceParallelTorchNorm(cfg, 2, eps=1e-5)
    assert cfg.sequence_parallel is True  # the caller's config is not modified
    assert all(getattr(p, "sequence_parallel", False) for p in norm.parameters())
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.5]))
    y = norm(torch.tensor([[3.0, 4.0]]))
    rms = ((9 + 16) / 2 + 1e-5) ** 0.5
    assert y.tolist()[0] == pytest.approx([2.0 * 3 / rms, 0.5 * 4 / rms], rel=1e-6)


def test_8_split_sizes_become_numpy():
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    sizes = torch.tensor([3, 1])
    cpu_compat.revert(only=(8,))
    assert torch.is_tensor(token_dispatcher.maybe_move_tensor_to_cpu(sizes, as_numpy=True))
    cpu_compat.apply(only=(8,))
    for mod in (moe_utils, token_dispatcher):
        out = mod.maybe_move_tensor_to_cpu(sizes, as_numpy=True)
        assert not torch.is_tensor(out) and out.tolist() == [3, 1]
        assert mod.maybe_move_tensor_to_cpu(sizes) is sizes  # as_numpy=False unchanged


def test_9_recompute_checkpoint_rng_state():
    """`tensor_parallel.checkpoint` (activation recompute) runs and its gradient equals the direct one."""
    from megatron.core import tensor_parallel

    def fn(x):
        return (x * x).sum(dim=0)

    x = torch.tensor([[1.0, -2.0], [3.0, 0.5]], requires_grad=True)
    cpu_compat.revert(only=(9,))
    with pytest.raises(NO_CUDA, match=CUDA_MSG):
        tensor_parallel.checkpoint(fn, False, x)
    cpu_compat.apply(only=(9,))
    tensor_parallel.checkpoint(fn, False, x).sum().backward()
    assert x.grad.tolist() == [[2.0, -4.0], [6.0, 1.0]]  # d/dx sum(x^2) = 2x


def test_10_float16_optimizer_type_check():
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer import optimizer as mopt

    p = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    cfg = OptimizerConfig(optimizer="adam", lr=0.1, bf16=True, params_dtype=torch.bfloat16)

    def build():
        return mopt.Float16OptimizerWithFloat16Params(torch.optim.SGD([p], lr=0.1), cfg, None, lambda: None)

    cpu_compat.revert(only=(10,))
    with pytest.raises(NO_CUDA, match=CUDA_MSG):  # _scale_one on device="cuda", then the type check
        build()
    cpu_compat.apply(only=(10,))
    opt = build()
    main = opt.fp32_from_float16_groups[0][0]
    assert main.dtype == torch.float32 and main.tolist() == [1.0, 2.0]  # the FP32 main copy


def test_12_tied_embedding_copy_on_the_last_stage():
    """`setup_embeddings_and_output_layer` of a last pipeline stage with tied embeddings (a world of one
    gloo rank that is its own embedding group): the copy stays on CPU and the all-reduce runs on it."""
    import torch.distributed as dist
    from megatron.core.models.common.language_module.language_module import LanguageModule

    weight = torch.nn.Parameter(torch.tensor([[1.5, -2.0]]))
    calls = []
    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(pipeline_model_parallel_size=2, mtp_num_layers=0, use_mup=False,
                                   init_model_with_meta_device=False),  # 0.19 reads the last two
        pre_process=False, post_process=True, share_embeddings_and_output_weights=True, vp_stage=None, vp_size=None,
        pp_group=None, output_layer=types.SimpleNamespace(weight=weight), embd_group="embd",
        shared_embedding_or_output_weight=lambda: weight, _is_in_embd_group=lambda: True)
    real = dist.all_reduce, dist.is_initialized
    dist.all_reduce, dist.is_initialized = (lambda t, group=None: calls.append((t.device.type, group))), (lambda: True)
    try:
        import megatron.core.models.common.language_module.language_module as lm

        first = lm.is_pp_first_stage
        lm.is_pp_first_stage = lambda group: False
        try:
            cpu_compat.revert(only=(12,))
            with pytest.raises(NO_CUDA, match=CUDA_MSG):
                LanguageModule.setup_embeddings_and_output_layer(fake)
            cpu_compat.apply(only=(12,))
            weight.data.fill_(3.0)
            LanguageModule.setup_embeddings_and_output_layer(fake)
        finally:
            lm.is_pp_first_stage = first
    finally:
        dist.all_reduce, dist.is_initialized = real
    assert calls == [("cpu", "embd")] and weight.tolist() == [[0.0, 0.0]]  # zeroed, then summed with stage 0's
