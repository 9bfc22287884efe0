"""Stitching an episode's recorded endpoint calls into training samples. Pure: no I/O.

An agent that talks to the endpoint (`episodes/agent_server.py`) makes one call per assistant turn. Call k
extends call k-1 when its prompt ids start with call k-1's prompt ids + output ids (the endpoint builds them
that way when the agent sends the conversation back unchanged); then both are one sample, the extension's
new ids are environment ids (the chat template's ids for the tool/user messages and the next assistant
header). A call that does not extend starts a new sample and is counted as a broken prefix (the agent edited
or dropped history, or re-templating was needed). This is prime-rl's "extension property" and miles' prefix
reuse; the sample layout is that of an episode sample:

- `prompt_ids`: the first call's prompt ids (the opening, templated once);
- `output_ids`: every id after it, generated and environment spans in order;
- `loss_mask`: 1 on generated ids, 0 on environment ids;
- `gen_logprobs`, `weight_versions`: the engine's values on generated ids; 0.0 and the preceding generated
  token's version on environment ids (the first call's first version if nothing was generated yet);
- `submitted_version`: the version at the sample's first generated token (PipelineRL-k counts staleness from it);
- `turns` (the calls) and `env_tokens` (the environment ids);
- `unknown_ids` and `seen`: the calls' tokenizer coverage of the ids the endpoint templated (the opening, then
  each call's new messages; episodes/coverage.py);
- `routes`: the calls' routes concatenated (position t from the call whose forward sampled id t + 1), or None
  when a call of the sample recorded none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scalerl_mega.episodes.calls import RecordedCall
from scalerl_mega.types import Completion, Routes


@dataclass(kw_only=True, slots=True)
class StitchResult:
    samples: list[Completion] = field(default_factory=list)
    broken_prefixes: int = 0
    """Calls that did not extend the previous call's ids and so started a new sample."""


def extends(call: RecordedCall, prev: RecordedCall) -> bool:
    """True when `call`'s prompt starts with `prev`'s prompt + output ids (and is not shorter than them)."""
    n, m = len(prev.prompt_ids), len(prev.output_ids)
    return (len(call.prompt_ids) >= n + m and call.prompt_ids[:n] == prev.prompt_ids
            and call.prompt_ids[n:n + m] == prev.output_ids)


def stitch_calls(calls: list[RecordedCall], *, prompt_id: str, sample_index_base: int = 0) -> StitchResult:
    """The samples of one episode's calls, in call order (see module doc); sample i gets index
    `sample_index_base + i`. No calls: no samples."""
    out = StitchResult()
    runs: list[list[RecordedCall]] = []
    for i, call in enumerate(calls):
        if runs and extends(call, runs[-1][-1]):
            runs[-1].append(call)
            continue
        if i > 0:
            out.broken_prefixes += 1
        runs.append([call])
    for j, run in enumerate(runs):
        out.samples.append(_sample(run, prompt_id=prompt_id, sample_index=sample_index_base + j))
    return out


def _sample(run: list[RecordedCall], *, prompt_id: str, sample_index: int) -> Completion:
    first = run[0]
    versions_seen = [v for c in run for v in c.weight_versions]
    last_version = versions_seen[0] if versions_seen else 0
    ids: list[int] = []
    n_env = 0
    mask: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    total = list(first.prompt_ids)  # the sample's ids so far
    for k, call in enumerate(run):
        env = call.prompt_ids[len(total):] if k else []
        n_env += len(env)
        ids += env
        mask += [0] * len(env)
        logprobs += [0.0] * len(env)
        versions += [last_version] * len(env)
        ids += call.output_ids
        mask += [1] * len(call.output_ids)
        logprobs += call.gen_logprobs
        versions += call.weight_versions
        if call.weight_versions:
            last_version = call.weight_versions[-1]
        total = call.prompt_ids + call.output_ids
    return Completion(prompt_id=prompt_id, sample_index=sample_index, prompt_ids=list(first.prompt_ids),
                      output_ids=ids, gen_logprobs=logprobs, weight_versions=versions,
                      finish_reason=run[-1].finish_reason, loss_mask=mask,
                      submitted_version=versions_seen[0] if versions_seen else 0, routes=_routes(run),
                      turns=len(run), env_tokens=n_env, unknown_ids=sum(c.unknown_ids for c in run),
                      seen=[c.seen for c in run])


def _routes(run: list[RecordedCall]) -> Routes | None:
    """Position t of the stitched sample from the call whose forward covered it last before sampling: call
    k adds the positions from the end of the ids before it (minus one: the last id had no forward yet) to
    the end of its own ids (minus one)."""
    if any(c.routes is None for c in run):
        return None
    first = run[0].routes
    per = first.num_layers * first.topk
    with_weights = all(len(c.routes.weights) for c in run)
    ids_parts, w_parts, versions = [], [], []
    covered = 0  # positions taken so far
    for call in run:
        r = call.routes
        if (r.num_layers, r.topk) != (first.num_layers, first.topk):
            raise ValueError(f"stitch_calls: a call's routes are {r.num_layers}x{r.topk} (layers x top-k), the "
                             f"first call's {first.num_layers}x{first.topk}")
        end = len(call.prompt_ids) + len(call.output_ids) - 1
        if r.num_positions < end:
            raise ValueError(f"stitch_calls: a call's routes cover {r.num_positions} positions, its ids need {end}")
        ids_parts.append(r.expert_ids[covered * per:end * per])
        if with_weights:
            w_parts.append(r.weights[covered * per:end * per])
        versions += list(r.versions[covered:end])
        covered = end
    return Routes(num_layers=first.num_layers, topk=first.topk, expert_ids=_concat(ids_parts),
                  weights=_concat(w_parts) if with_weights else [], versions=versions)


def _concat(parts: list) -> object:
    if parts and all(isinstance(p, list) for p in parts):
        return [x for p in parts for x in p]
    import numpy as np

    return np.concatenate([np.asarray(p) for p in parts]) if parts else []
