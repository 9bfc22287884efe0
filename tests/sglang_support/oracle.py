"""The trainer-side references the `sglang`-marked tests compare the real server with (transformers FP32
forwards of the tiny model; log_softmax in float64), and polling helpers."""

from __future__ import annotations

import time

import requests
import torch

_MODELS: dict[int, torch.nn.Module] = {}


def weights(seed: int):
    """The tiny Llama with the weights of `seed` (cached; seed 0 = the checkpoint the server loads)."""
    from tests.sglang_support.tiny_model import tiny_llama_weights

    if seed not in _MODELS:
        _MODELS[seed] = tiny_llama_weights(seed)
    return _MODELS[seed]


def full_logprobs(model, prompt: list[int], output: list[int]) -> list[float]:
    """The trainer's log-probs of `output` after `prompt`: one FP32 forward, log_softmax in float64."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output)]


def in_place_logprobs(old, new, prompt: list[int], output: list[int], boundary: int) -> list[float]:
    """What an in_place update at output token `boundary` computes: tokens before it with the old weights;
    from it on the new weights, attending to KV the old weights wrote for every position before the one
    that samples token `boundary` (position len(prompt) + boundary - 1)."""
    from transformers import DynamicCache

    ids = prompt + output
    cut = len(prompt) + boundary - 1
    with torch.no_grad():
        cache = DynamicCache(config=old.config)
        old(torch.tensor([ids[:cut]]), past_key_values=cache, use_cache=True)
        logits = new(torch.tensor([ids[cut : len(ids) - 1]]), past_key_values=cache, use_cache=True).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    tail = [logp[j, t].item() for j, t in enumerate(output[boundary:])]
    return full_logprobs(old, prompt, output)[:boundary] + tail


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def abs_dlogp(completions, prompt: list[int], *models, tokens: int, version: int) -> list[list[float]]:
    """Per model of `models`: |engine log-prob - the model's full forward| of every generated token of
    `completions` (each must hold `tokens` tokens, all of weight `version`)."""
    out: list[list[float]] = [[] for _ in models]
    for c in completions:
        assert c.weight_versions == [version] * tokens
        for diffs, model in zip(out, models):
            diffs += [abs(a - b) for a, b in zip(c.gen_logprobs, full_logprobs(model, prompt, c.output_ids))]
    return out


def collect(engine, n: int, *, timeout_s: float = 300.0):
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += engine.poll(0.5)
    assert len(out) == n, f"got {len(out)}/{n} completions within {timeout_s}s"
    return out


def wait_decoding(url: str, *, min_tokens: int, timeout_s: float = 120.0) -> None:
    """Poll SGLang's GET /v1/loads until a running request holds at least `min_tokens` KV tokens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        load = requests.get(url + "/v1/loads", timeout=30).json()["loads"][0]
        if load["num_running_reqs"] >= 1 and load["num_used_tokens"] >= min_tokens:
            return
        time.sleep(0.05)
    raise AssertionError(f"no request reached {min_tokens} tokens on {url} within {timeout_s}s: {load}")
