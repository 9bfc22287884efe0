"""An in-flight weight update on the local engine core, and its reference: transformers' own cache stepping one
request token by token and swapping the weights at the same token (tests of `rollout.core.GenerationCore`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.rollout.core import GenerationCore
    from scalerl_mega.types import Completion


def update_after(core: "GenerationCore", *, rid: str, k: int,
                 weights: dict[str, "torch.Tensor"]) -> list["Completion"]:
    """Step `core` until request `rid` has sampled `k` tokens, load `weights` as version 1 between two steps, run
    to the end; every completion."""
    done = []
    while not any(r.req.rid == rid and len(r.output_ids) == k for r in core.rows):
        done += core.step()
    core.load_weights(weights.items())
    core.set_version(1)
    return done + core.run_until_done()


def swapped_reference(model, weights: dict[str, "torch.Tensor"], prompt: list[int], *, k: int, total: int,
                      seed: int, cache) -> tuple[list[int], list[float]]:
    """Tokens and float64 log-probs of one request sampled (temperature 1, the engine's seeded sampler) by `model`
    over transformers' `cache`, `weights` loaded after the k-th token."""
    import torch

    from scalerl_mega.rollout.sampling import sample_tokens

    ids, tokens, lps = torch.tensor([prompt]), [], []
    with torch.no_grad():
        for step in range(total):
            if step == k:
                model.load_state_dict(weights)
            logits = model(ids, past_key_values=cache, use_cache=True).logits[:, -1].float()
            tok, _ = sample_tokens(logits, temperature_N=torch.ones(1), top_p_N=torch.ones(1),
                                   seeds_N=torch.tensor([seed]), steps_N=torch.tensor([step]))
            tokens.append(tok.item())
            lps.append(torch.log_softmax(logits.double(), -1)[0, tok.item()].item())
            ids = tok.view(1, 1)
    return tokens, lps
