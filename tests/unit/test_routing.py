"""Rollout routing replay plumbing: route tensors in the batch, padding, layer columns and
the exact agreement aggregate. Hand-worked values; the Megatron replay itself is exercised in
tests/integration/test_routing_replay.py and test_multirank_moe.py."""

from __future__ import annotations

import pytest
import torch

from scalerl_mega.batch import build_train_batch
from scalerl_mega.model.config import load_model_preset
from scalerl_mega.trainer.megatron.routing import _flat, agreement_metrics, moe_columns
from scalerl_mega.trainer.policy_loss import batch_tensors, pad_batch
from scalerl_mega.types import Completion, FinishReason, Group, Prompt, Routes, ScoredCompletion


def _comp(pid, prompt, out, routes, idx=0):
    return Completion(prompt_id=pid, sample_index=idx, prompt_ids=prompt, output_ids=out,
                      gen_logprobs=[-0.5] * len(out), weight_versions=[3] * len(out),
                      finish_reason=FinishReason.STOP, routes=routes)


def _routes(n, L=2, K=1, base=0):
    """Position t, layer l -> expert (base + t + l) % 4, weight 0.1 * (t + 1) + 0.01 * l."""
    ids = [(base + t + l) % 4 for t in range(n) for l in range(L) for _ in range(K)]
    w = [0.1 * (t + 1) + 0.01 * l for t in range(n) for l in range(L) for _ in range(K)]
    return Routes(num_layers=L, topk=K, expert_ids=ids, weights=w, versions=[3] * n)


def _groups(r1, r2):
    g = Group(prompt=Prompt(prompt_id="a", text="", task="synthetic", gold=""), samples=[
        ScoredCompletion(completion=_comp("a", [5, 6], [7, 8, 9], r1), reward=1.0, passed=True),
        ScoredCompletion(completion=_comp("a", [5, 6], [10], r2, idx=1), reward=0.0, passed=False)])
    return [g]


def _build(groups):
    return build_train_batch(groups, adv_norm="none", adv_eps=0.0, aggregation="token",
                             filter_zero_variance=False, micro_batch_tokens=64, policy_version=3).batch


def test_routes_are_laid_out_by_input_position():
    # row 0: 2 + 3 tokens -> 4 routed input positions; row 1: 2 + 1 tokens -> 2
    b = _build(_groups(_routes(4), _routes(2, base=1)))
    assert b.route_ids_BTLK.shape == (2, 5, 2, 1)
    assert b.route_mask_BT.tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert b.route_ids_BTLK[0, :, :, 0].tolist() == [[0, 1], [1, 2], [2, 3], [3, 0], [0, 0]]
    assert b.route_ids_BTLK[1, :2, :, 0].tolist() == [[1, 2], [2, 3]]
    assert b.route_weights_BTLK[0, 2, 1, 0].item() == pytest.approx(0.31)
    # every trained position (loss mask) has a route: position t predicts token t + 1
    assert bool(((b.loss_mask_BT > 0) <= (b.route_mask_BT > 0)).all())
    data = batch_tensors(b)
    assert data["route_ids"] is b.route_ids_BTLK and data["route_mask"] is b.route_mask_BT


def test_routes_all_or_none_and_shape_checked():
    assert _build(_groups(None, None)).route_ids_BTLK is None
    with pytest.raises(ValueError, match="no MoE routes while others do"):
        _build(_groups(_routes(4), None))
    bad = _routes(4)
    bad.expert_ids.pop()
    with pytest.raises(ValueError, match="expected 4x2x1=8"):
        _build(_groups(bad, _routes(2)))
    with pytest.raises(ValueError, match="do not fit"):
        _build(_groups(_routes(4), _routes(2, L=3)))


def test_pad_batch_and_micro_batch_cut_carry_route_tensors():
    from scalerl_mega.trainer.microbatch import cut_micro_batch

    data = batch_tensors(_build(_groups(_routes(4), _routes(2))))
    out = pad_batch(data, cols_multiple=4)
    assert out["route_ids"].shape == (2, 8, 2, 1) and out["route_mask"].shape == (2, 8)
    assert torch.equal(out["route_ids"][:, :5], data["route_ids"])
    assert out["route_mask"][:, 5:].sum() == 0 and out["route_ids"][:, 5:].abs().sum() == 0
    # a micro-batch of row 1 trimmed to 3 columns, then widened to a multiple of 4 (sequence parallel)
    mb = cut_micro_batch(data, [1], [5, 3], packed=False, cols_multiple=4)
    assert mb["route_ids"].shape == (1, 4, 2, 1)
    assert torch.equal(mb["route_ids"][0, :3], data["route_ids"][1, :3])
    assert torch.equal(mb["route_mask"][0, :3], data["route_mask"][1, :3]) and mb["route_mask"][0, 3] == 0


def test_moe_columns_follow_the_moe_layers():
    cfg = load_model_preset("tiny_moe", overrides={"num_layers": 6, "moe_layer_freq": 2})
    # moe layers are the last of each period of 2: 1, 3, 5 (0-based)
    assert moe_columns(cfg) == {1: 0, 3: 1, 5: 2}
    assert moe_columns(load_model_preset("tiny_moe")) == {0: 0, 1: 1}


def test_flat_is_the_routers_sequence_major_order():
    x = torch.arange(2 * 3).view(2, 3)  # [B=2, T=3]
    # Megatron's router flattens [S, B]: token index s * B + b
    assert _flat(x, {"lo": 0, "hi": 3}).tolist() == [0, 3, 1, 4, 2, 5]
    assert _flat(x, {"lo": 1, "hi": 3}).tolist() == [1, 4, 2, 5]  # a sequence-parallel chunk


def test_agreement_metrics_are_ratios_of_global_sums():
    # layer 0: 9 of 10 tokens agree (natural 7), on-policy 4 of 4; layer 1: 10 of 10 (natural 10), 4 of 4
    counts = torch.tensor([[[9.0, 7.0, 10.0], [4.0, 3.0, 4.0]],
                           [[10.0, 10.0, 10.0], [4.0, 4.0, 4.0]]], dtype=torch.float64)
    m = agreement_metrics(counts)
    assert m["routing_agreement"] == pytest.approx(19 / 20)
    assert m["routing_agreement_natural"] == pytest.approx(17 / 20)
    assert m["routing_agreement_onpolicy"] == 1.0 and m["routing_agreement_natural_onpolicy"] == pytest.approx(7 / 8)
    assert m["routing_agreement/layer0"] == pytest.approx(0.9) and m["routing_agreement/layer1"] == 1.0
    assert m["routing_tokens"] == 10.0 and m["routing_tokens_onpolicy"] == 4.0
    # a selection without tokens has no ratio
    counts[:, 1] = 0.0
    assert "routing_agreement_onpolicy" not in agreement_metrics(counts)


def test_replay_config_is_validated_naming_the_key():
    from scalerl_mega.model.config import MegatronConfig

    moe = load_model_preset("tiny_moe")
    MegatronConfig(model=moe, routing_replay="ids_and_weights").validate(world_size=1)
    with pytest.raises(ValueError, match="routing_replay='both' is not one of"):
        MegatronConfig(model=moe, routing_replay="both").validate(world_size=1)
    with pytest.raises(ValueError, match="needs an MoE model"):
        MegatronConfig(model=load_model_preset("tiny_dense"), routing_replay="ids").validate(world_size=1)
    with pytest.raises(ValueError, match="recompute='full'"):
        MegatronConfig(model=moe, routing_replay="ids", recompute="full").validate(world_size=1)


def test_ids_only_routes_give_no_weights_tensor():
    ids_only = _routes(4)
    ids_only.weights = []
    b = _build(_groups(ids_only, _routes(2)))
    assert b.route_weights_BTLK is None and b.route_ids_BTLK[0, 1, 0, 0].item() == 1
    assert "route_weights" not in batch_tensors(b)


def test_sglang_with_ids_and_weights_is_refused():
    from scalerl_mega.cluster.launch_config import compose, settings

    base = ["experiment=demo", "rollout=sglang"]
    assert settings(compose([*base, "moe.routing_replay=ids"]))["ROUTED_EXPERTS"] == "1"
    with pytest.raises(ValueError, match="returns the routed expert ids only"):
        compose([*base, "moe.routing_replay=ids_and_weights"])
    with pytest.raises(ValueError, match="moe.record_routes=false"):
        compose([*base, "moe.routing_replay=ids", "moe.record_routes=false"])
    assert settings(compose(["experiment=demo", "model=tiny_dense"]))["ROUTED_EXPERTS"] == "0"


def _np_routes(n, *, E, L=2, K=1, with_weights=True):
    """Engine-style routes: numpy ids of `route_id_dtype(E)` (expert (7 t + l) % E), float32 weights."""
    import numpy as np

    from scalerl_mega.types import route_id_dtype

    ids = np.array([(7 * t + l) % E for t in range(n) for l in range(L) for _ in range(K)], dtype=route_id_dtype(E))
    w = np.full(n * L * K, 0.25, dtype=np.float32) if with_weights else np.zeros(0, np.float32)
    return Routes(num_layers=L, topk=K, expert_ids=ids, weights=w, versions=[3] * n)


def test_batch_keeps_compact_route_ids_and_drops_weights_unless_asked():
    """Scout (16 experts): uint8 ids, 1 byte per (position, layer, slot); more than 256 experts: int32
    (gloo refuses int16); the float32 weights tensor only with route_weights=True (ids_and_weights)."""
    from scalerl_mega.types import route_id_dtype

    assert (route_id_dtype(16), route_id_dtype(256), route_id_dtype(257)) == ("uint8", "uint8", "int32")
    groups = _groups(_np_routes(4, E=16), _np_routes(2, E=16))
    b = build_train_batch(groups, adv_norm="none", adv_eps=0.0, aggregation="token", filter_zero_variance=False,
                          micro_batch_tokens=64, policy_version=3, route_weights=False).batch
    ids = b.route_ids_BTLK
    assert ids.dtype == torch.uint8 and ids.shape == (2, 5, 2, 1) and ids.numel() * ids.element_size() == 20
    assert b.route_weights_BTLK is None and "route_weights" not in batch_tensors(b)
    assert ids[0, :, :, 0].tolist() == [[0, 1], [7, 8], [14, 15], [5, 6], [0, 0]]  # (7t + l) % 16, row padded
    assert ids[1, :2, :, 0].tolist() == [[0, 1], [7, 8]]
    with_w = _build(groups)  # default route_weights=True (the replay probe): weights kept
    assert with_w.route_weights_BTLK.dtype == torch.float32 and with_w.route_weights_BTLK[0, 3, 1, 0].item() == 0.25
    wide = _build(_groups(_np_routes(4, E=300), _np_routes(2, E=300)))
    assert wide.route_ids_BTLK.dtype == torch.int32 and wide.route_ids_BTLK[0, 3, 0, 0].item() == 21
    # the follower broadcast: the compact dtype round-trips through ranks.py's dtype names
    from scalerl_mega.weight_sync import dtype_from_name

    assert dtype_from_name(str(ids.dtype).replace("torch.", "")) == torch.uint8


def test_routes_recorded_only_when_replayed():
    """moe.record_routes unset: routes (SGLang's return_routed_experts / --enable-return-routed-experts,
    the local engine's hooks) only with replay on; true records them without replay (agreement metrics)."""
    from scalerl_mega.build import sglang_route_layout
    from scalerl_mega.cluster.launch_config import compose, settings
    from scalerl_mega.config import records_routes

    base = ["experiment=demo", "rollout=sglang"]
    off = compose(base)
    assert off.moe.routing_replay == "none" and off.moe.record_routes is None
    assert not records_routes(off) and settings(off)["ROUTED_EXPERTS"] == "0" and sglang_route_layout(off) is None
    on = compose([*base, "moe.routing_replay=ids"])
    layout = sglang_route_layout(on)
    assert records_routes(on) and settings(on)["ROUTED_EXPERTS"] == "1"
    assert (layout.num_experts, layout.topk) == (on.model.num_experts, on.model.moe_topk)
    forced = compose([*base, "moe.record_routes=true"])
    assert records_routes(forced) and settings(forced)["ROUTED_EXPERTS"] == "1"
    dense = compose(["experiment=demo", "model=tiny_dense", "moe.record_routes=true"])
    assert not records_routes(dense) and settings(dense)["ROUTED_EXPERTS"] == "0"
