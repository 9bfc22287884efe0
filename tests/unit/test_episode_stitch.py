"""episodes/stitch.py: recorded endpoint calls -> episode samples, on hand-worked id lists."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl_mega.episodes.calls import GenerateResult, RecordedCall
from scalerl_mega.episodes.stitch import stitch_calls
from scalerl_mega.types import FinishReason, Routes

S, L = FinishReason.STOP, FinishReason.LENGTH


def call(prompt, out, *, lp=None, v=None, fin=S, routes=None):
    return RecordedCall(prompt_ids=prompt, output_ids=out, gen_logprobs=lp or [-0.5] * len(out),
                        weight_versions=v or [0] * len(out), finish_reason=fin, routes=routes)


def test_calls_that_extend_are_one_sample_with_environment_ids_masked():
    calls = [call([1, 2, 3], [10, 11], lp=[-0.1, -0.2], v=[4, 5]),
             call([1, 2, 3, 10, 11, 7, 8], [12], lp=[-0.3], v=[6]),
             call([1, 2, 3, 10, 11, 7, 8, 12, 9], [13, 14], lp=[-0.4, -0.5], v=[6, 7], fin=L)]
    res = stitch_calls(calls, prompt_id="p", sample_index_base=3)
    assert res.broken_prefixes == 0 and len(res.samples) == 1
    s = res.samples[0]
    assert (s.prompt_id, s.sample_index, s.prompt_ids) == ("p", 3, [1, 2, 3])
    assert s.output_ids == [10, 11, 7, 8, 12, 9, 13, 14]
    assert s.loss_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert s.gen_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3, 0.0, -0.4, -0.5]
    # environment ids carry the preceding generated token's version; staleness counts from the first token's
    assert s.weight_versions == [4, 5, 5, 5, 6, 6, 6, 7]
    assert s.submitted_version == 4 and s.finish_reason == L and s.routes is None
    assert (getattr(s, "turns", 3), getattr(s, "env_tokens", 3)) == (3, 3)  # where Completion has them


def test_a_broken_prefix_starts_a_new_sample_and_is_counted():
    calls = [call([1, 2], [5]),
             call([1, 2, 6, 3], [7]),        # 6 != 5: the agent changed the reply
             call([1, 2, 6, 3, 7, 4], [8]),  # extends the second
             call([9], [])]                  # a fresh conversation, nothing generated
    res = stitch_calls(calls, prompt_id="q")
    assert res.broken_prefixes == 2
    assert [(s.sample_index, s.prompt_ids, s.output_ids, s.loss_mask) for s in res.samples] == [
        (0, [1, 2], [5], [1]), (1, [1, 2, 6, 3], [7, 4, 8], [1, 0, 1]), (2, [9], [], [])]
    assert res.samples[2].submitted_version == 0 and res.samples[2].weight_versions == []
    assert stitch_calls([], prompt_id="q").samples == []


def test_a_prompt_shorter_than_the_previous_ids_does_not_extend():
    res = stitch_calls([call([1, 2], [5, 6]), call([1, 2, 5], [7])], prompt_id="p")
    assert res.broken_prefixes == 1 and len(res.samples) == 2


def _routes(n_pos, base, *, weights=True, layers=2, k=1):
    ids = np.arange(base, base + n_pos * layers * k, dtype=np.int64) % 251
    return Routes(num_layers=layers, topk=k, expert_ids=ids.astype(np.uint8),
                  weights=np.full(n_pos * layers * k, base / 1000, np.float32) if weights else [],
                  versions=[base] * n_pos)


def test_routes_concatenate_position_by_position():
    # call 1: 3 prompt + 2 output ids -> positions 0..3; call 2: 7 prompt + 1 output -> positions 0..6
    r1, r2 = _routes(4, 100), _routes(7, 200)
    s = stitch_calls([call([1, 2, 3], [10, 11], routes=r1), call([1, 2, 3, 10, 11, 7, 8], [12], routes=r2)],
                     prompt_id="p").samples[0]
    # positions 0-3 from call 1 (its forwards sampled ids 1..4), 4-6 from call 2 (they sampled ids 5..7)
    assert s.routes.versions == [100] * 4 + [200] * 3
    want = np.concatenate([np.asarray(r1.expert_ids)[:8], np.asarray(r2.expert_ids)[8:14]])
    assert np.array_equal(s.routes.expert_ids, want)
    assert np.allclose(s.routes.weights, [0.1] * 8 + [0.2] * 6)
    s.routes.check(where="stitched")
    assert s.routes.num_positions == len(s.prompt_ids) + len(s.output_ids) - 1
    # a call without routes: none for the sample; one without weights (SGLang): expert ids only
    assert stitch_calls([call([1], [2], routes=r1), call([1, 2, 3], [4])], prompt_id="p").samples[0].routes is None
    s = stitch_calls([call([1, 2, 3], [10, 11], routes=r1),
                      call([1, 2, 3, 10, 11, 7, 8], [12], routes=_routes(7, 200, weights=False))],
                     prompt_id="p").samples[0]
    assert list(s.routes.weights) == [] and len(s.routes.expert_ids) == 14


def test_routes_that_do_not_cover_the_ids_are_refused():
    with pytest.raises(ValueError, match="cover 3 positions, its ids need 4"):
        stitch_calls([call([1, 2, 3], [10, 11], routes=_routes(3, 1))], prompt_id="p")


def test_generate_result_lengths_are_checked():
    with pytest.raises(ValueError, match="2 output ids but 1 log-probs"):
        GenerateResult(output_ids=[1, 2], gen_logprobs=[0.0], weight_versions=[0, 0], finish_reason=S)
