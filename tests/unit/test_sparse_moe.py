"""The engine's sparse expert dispatch against HF's dense `Llama4TextMoe` (same weights, same inputs)."""

import copy

import pytest
import torch

from scalerl_mega.rollout.local import LocalModelSpec, build_model
from scalerl_mega.rollout.sparse_moe import use_sparse_moe

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _llama4(*, experts: int, topk: int, seed: int = 0):
    cfg = dict(vocab_size=61, hidden_size=32, intermediate_size=16, intermediate_size_mlp=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=experts,
               num_experts_per_tok=topk, interleave_moe_layer_step=1, no_rope_layers=[1, 0],
               attention_chunk_size=8, max_position_embeddings=64, tie_word_embeddings=False)
    model = build_model(LocalModelSpec(arch="llama4", config=cfg, init_seed=seed))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every expert with its own non-trivial weights
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


@pytest.mark.parametrize("experts,topk", [(4, 1), (5, 2)])
def test_sparse_dispatch_equals_dense_moe_layer_in_float64(experts, topk):
    dense = _llama4(experts=experts, topk=topk).double()
    sparse = copy.deepcopy(dense)
    assert use_sparse_moe(sparse) == 2
    x_NH = torch.randn(37, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for d_layer, s_layer in zip(dense.model.layers, sparse.model.layers):
        d_out, d_logits = d_layer.feed_forward(x_NH)
        s_out, s_logits = s_layer.feed_forward(x_NH)
        assert torch.equal(s_logits, d_logits)
        assert torch.allclose(s_out, d_out, rtol=0, atol=1e-12)
        # the routed part is not negligible: dropping the selected experts changes the output
        assert (d_out - s_layer.feed_forward.shared_expert(x_NH)).abs().max() > 0.1


def test_sparse_model_logits_match_dense_in_float32_and_router_hooks_still_fire():
    dense = _llama4(experts=4, topk=1)
    sparse = copy.deepcopy(dense)
    use_sparse_moe(sparse)
    seen = []
    sparse.model.layers[0].feed_forward.router.register_forward_hook(lambda m, a, o: seen.append(o[1].shape))
    ids = torch.randint(0, 61, (3, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        d = dense(input_ids=ids).logits
        s = sparse(input_ids=ids).logits
    assert torch.allclose(s, d, rtol=0, atol=1e-5) and d.abs().max() > 1.0
    assert seen == [torch.Size([33, 4])]


def test_dense_model_is_left_alone():
    model = build_model(LocalModelSpec(arch="llama", config=dict(vocab_size=24, hidden_size=32, intermediate_size=64,
                                                                  num_hidden_layers=2, num_attention_heads=4),
                                       init_seed=0))
    assert use_sparse_moe(model) == 0
