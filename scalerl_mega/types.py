"""Data types that flow through the RL loop (prompts -> rollouts -> rewards -> groups -> batch).

prompts -> rollouts (Completion) -> rewards -> groups (Group) -> batch (TrainBatch) -> loss.

All are keyword-only dataclasses. Token-level lists are plain Python lists so that completions can
cross process boundaries (pickle / JSON) cheaply; TrainBatch holds tensors. Only the standard library
is imported here (torch appears only in type annotations).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch


class FinishReason(str, enum.Enum):
    """Why a completion ended."""

    STOP = "stop"
    """The model emitted a stop token (EOS or a configured stop id)."""
    LENGTH = "length"
    """The generation budget ran out: a truncation (paper App. A.13)."""
    INTERRUPTED = "interrupted"
    """Forced interruption (paper Sec. 2): the end-of-thinking phrase was injected at the sampled
    length, and the model then stopped within the answer budget. An interrupted completion that
    runs out of answer budget too ends with LENGTH (it is truncated, App. A.13); `interrupted_at`
    records the interruption either way."""
    ABORT = "abort"
    """The engine aborted the request (e.g. PPO-off-policy sync with mode=abort); partial output."""


@dataclass(kw_only=True, slots=True)
class Prompt:
    """One training or validation prompt."""

    prompt_id: str
    """Stable id: a hash of the prompt content (see data/split.py), identical across runs."""
    text: str
    """The formatted prompt text given to the model (after the task's prompt template)."""
    task: str
    """Reward family: "math", "code" or "synthetic" (scored by the math verifier)."""
    gold: Any
    """Reference: the gold answer string (math) or a list of test dicts (code)."""
    token_ids: list[int] | None = None
    """Tokenised prompt, filled by the loop before submission."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form metadata carried through to metrics (source file, row, difficulty, ...)."""
    row: dict[str, Any] | None = None
    """The dataset row as read, every column unchanged (None: a generated task, whose row is `meta`); episodes
    pass it to `reset(task)` and agents (`episodes.env.task_row`)."""


@dataclass(kw_only=True, slots=True)
class SamplingParams:
    """Per-request sampling parameters (map 1:1 onto SGLang's `sampling_params`)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    """Per-sample seed (SGLang `sampling_seed`); G samples of a prompt get seed + i."""
    interruption_at: int | None = None
    """Forced interruption (paper Sec. 2, App. A.11): after this many generated tokens, the
    end-of-thinking phrase is injected; None disables interruption for this request."""
    interruption_ids: list[int] = field(default_factory=list)
    """Token ids of the end-of-thinking phrase injected at `interruption_at`."""
    answer_budget: int = 0
    """Tokens the model may still generate after an interruption (the solution budget)."""
    hold_at: int | None = None
    """Rehearsal knob (`rollout.inflight_hold_tokens`, local engine only): once this request has
    generated `hold_at` tokens, the engine stops decoding while nothing else needs progress and the
    engine's weights are still those the request was submitted under, i.e. until the next weight
    update arrives. The loop sets it only on requests that cannot be trained before that update
    (PipelineRL), so a completion deterministically spans two weight versions. None: never held."""


def route_id_dtype(num_experts: int) -> str:
    """The compact integer dtype (numpy/torch name) for expert ids 0..num_experts-1: uint8 up to 256
    experts (Scout: 16), else int32 (not int16: gloo, which carries the batch to follower ranks,
    refuses int16 tensors)."""
    return "uint8" if 0 < num_experts <= 256 else "int32"


@dataclass(kw_only=True, slots=True)
class Routes:
    """MoE routes the generator used (rollout routing replay): for each input position of
    the sequence (prompt + output tokens the engine ran a forward on, i.e. all but the last output
    token), each MoE layer (ascending layer index) and each of the top-k slots, the expert id (a
    global id, 0..E-1) and its routing weight (the gate value the engine applied), row-major flat
    [N, L, K], plus the weight version whose forward produced the position's route. The engines give
    `expert_ids` as a 1-D numpy array of `route_id_dtype(E)` and `weights` as float32 numpy (no Python
    int per id: Scout's routes are ~10^9 ids a step); plain lists are accepted too.

    Position t's route is the one of the forward whose logits sampled token t + 1, so it aligns with
    the trainer's position t (which predicts `targets[t]` = token t + 1)."""

    num_layers: int
    topk: int
    expert_ids: Any
    """Flat [N, L, K] expert ids: a 1-D integer numpy array (engines) or a list."""
    weights: Any
    """Empty when the engine reports expert ids only (SGLang 0.5.23 returns no gate weights)."""
    versions: list[int]
    """Weight version of each position's route ([N]). Prompt positions: the prefill's version."""

    @property
    def num_positions(self) -> int:
        return len(self.versions)

    def check(self, *, where: str) -> None:
        """ValueError naming `where` if the flat lists do not match [N, L, K]."""
        n = self.num_positions * self.num_layers * self.topk
        if len(self.expert_ids) != n or len(self.weights) not in (0, n):
            raise ValueError(f"{where}: routes have {len(self.expert_ids)} expert ids and {len(self.weights)} "
                             f"weights, expected {self.num_positions}x{self.num_layers}x{self.topk}={n}")


@dataclass(kw_only=True, slots=True)
class Completion:
    """One sampled completion, as produced by a RolloutEngine.

    `output_ids`, `gen_logprobs`, `weight_versions` and `loss_mask` have one entry per output token.
    """

    prompt_id: str
    sample_index: int
    """Index of this sample within its prompt's group (0..G-1)."""
    prompt_ids: list[int]
    output_ids: list[int]
    gen_logprobs: list[float]
    """Generator log-probabilities of each output token, from FP32 logits when the FP32 head is on
    (paper Sec. 3.2 "FP32 Precision"); 0.0 for injected (non-sampled) tokens."""
    weight_versions: list[int]
    """Weight version that produced each output token (PipelineRL: several per completion)."""
    finish_reason: FinishReason
    loss_mask: list[int] | None = None
    """1 for sampled tokens, 0 for injected ones (the interruption phrase). None means all 1."""
    interrupted_at: int | None = None
    """Index into `output_ids` where the interruption phrase starts, if one was injected."""
    text: str | None = None
    """Decoded output text (filled by the loop or engine for reward scoring)."""
    submitted_version: int = 0
    """Trainer step (weight version) current when the request was admitted: staleness is measured
    from here (PipelineRL-k bound)."""
    timings: dict[str, float] = field(default_factory=dict)
    routes: Routes | None = None
    """MoE routes the generator used for prompt and output positions (None: not recorded / dense)."""
    turns: int = 1
    """Assistant turns of the episode (`env=custom` / `env=agent`); a single-turn sample is a one-turn episode:
    `output_ids` then holds the generated spans and the environment's spans in order, `loss_mask` 0 on the latter,
    `gen_logprobs` 0.0 and `weight_versions` the preceding generated token's version there."""
    env_tokens: int = 0
    """Environment ids spliced into `output_ids` (loss mask 0)."""
    episode_result: tuple[float, bool, str] | None = None
    """(reward, passed, reason) the episode's environment gave (the sum of its turns' rewards; a failed episode:
    `episodes.failures`, reason `dropped: <kind>: ...` when it is not trained): scored as is, without the reward
    group."""
    broken_prefixes: int = 0
    """`env=agent`: calls of the episode that did not extend the previous call's ids (episodes/stitch.py)."""
    refused_calls: int = 0
    """`env=agent`: calls of the episode the endpoint answered with an error (a 4xx: bad body, too long)."""
    messages: list[dict[str, Any]] | None = None
    """The episode's chat messages (the assistant's decoded from its generated ids), for `episodes.jsonl`."""
    unknown_ids: int = 0
    """Environment ids that are the tokenizer's unknown id (`env=custom`: the opening and the splices; `env=agent`:
    what the endpoint templated for the trained sample's calls; episodes/coverage.py)."""
    seen: list[str] | None = None
    """What the model saw of the opening and of each environment splice (the decoded ids; `env=agent`: one entry
    per call of the trained sample)."""

    @property
    def num_tokens(self) -> int:
        return len(self.output_ids)

    def mask(self) -> list[int]:
        """The loss mask, defaulting to all ones."""
        return self.loss_mask if self.loss_mask is not None else [1] * len(self.output_ids)


@dataclass(kw_only=True, slots=True)
class ScoredCompletion:
    """A completion with its reward."""

    completion: Completion
    reward: float
    passed: bool
    reason: str = ""


@dataclass(kw_only=True, slots=True)
class Group:
    """The G completions of one prompt (GRPO-style group)."""

    prompt: Prompt
    samples: list[ScoredCompletion]
    dropped: list[ScoredCompletion] = field(default_factory=list)
    """Episodes of this prompt that failed for reasons outside the policy (`episodes.failures`): not trained,
    not in `samples`, counted (`episode/dropped`)."""

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def pass_rate(self) -> float:
        return sum(1.0 for s in self.samples if s.passed) / max(len(self.samples), 1)


@dataclass(kw_only=True, slots=True)
class TrainBatch:
    """A packed training batch: B sequences of T tokens (prompt + output, right-padded), the trainer
    seam's input (`interfaces.PolicyTrainer.train_step`).

    The loss reads only output positions (`loss_mask` = 1). Tensors are on CPU when the batch is
    built (controller rank); the trainer moves each micro-batch to its device.
    """

    input_ids_BT: "torch.Tensor"
    """[B, T] int64 token ids (prompt followed by output)."""
    position_ids_BT: "torch.Tensor"
    """[B, T] int64 positions."""
    loss_mask_BT: "torch.Tensor"
    """[B, T] float32: 1 where the token at t+1... is a trained output token; see `targets_BT`."""
    targets_BT: "torch.Tensor"
    """[B, T] int64: the token predicted at each position (input shifted left; 0 where masked)."""
    gen_logp_BT: "torch.Tensor"
    """[B, T] float32 generator log-probs of `targets_BT` (0 where masked)."""
    advantages_B: "torch.Tensor"
    """[B] float32 advantages (already normalized)."""
    prompt_index_B: "torch.Tensor"
    """[B] int64 group (prompt) index of each sequence, 0..P-1."""
    token_weights_BT: "torch.Tensor"
    """[B, T] float32 loss-aggregation weights computed on the whole batch
    (`objective.losses.token_weights`: prompt / sample / token average), so that the losses of any
    split into micro-batches and data-parallel shards sum to the full-batch loss."""
    route_ids_BTLK: "torch.Tensor | None" = None
    """[B, T, L, K] expert ids the generator routed input position t to, per MoE layer and top-k
    slot (`Completion.routes`), in the engines' compact dtype (`route_id_dtype`: uint8 up to 256
    experts); 0 where `route_mask_BT` is 0. None: no routes recorded."""
    route_weights_BTLK: "torch.Tensor | None" = None
    """[B, T, L, K] float32 routing weights matching `route_ids_BTLK`: only for
    `moe.routing_replay=ids_and_weights` (None otherwise, and if the engine reported ids only)."""
    route_mask_BT: "torch.Tensor | None" = None
    """[B, T] float32: 1 where position t has a recorded route (prompt and output positions except the
    last token and padding)."""
    weight_version_BT: "torch.Tensor | None" = None
    """[B, T] int64 weight version per target token (for staleness metrics and the on-policy check)."""
    policy_version: int | None = None
    """Weight version of the policy being trained (the loop's step): completions generated entirely
    by it are on-policy, where trainer and generator log-probs must agree."""
    micro_batches: list[list[int]] = field(default_factory=list)
    """The micro-batch plan the trainer executes: row indices of each micro-batch
    (`batch.pack_micro_batches`: length-sorted, each trimmed to its own longest row, padded size
    within the token budget). Empty: the trainer plans with the same function."""
    lengths_B: list[int] = field(default_factory=list)
    """Unpadded length (prompt + output) of each row."""
    packed: bool = False
    """Each micro-batch of `micro_batches` is one packed row of its samples (attention masked per
    sample), not a [rows, longest] tensor."""
    prompt_ids: list[str] = field(default_factory=list)
    """Prompt id of each group index 0..P-1."""

    @property
    def num_rows(self) -> int:
        return int(self.input_ids_BT.shape[0])


@dataclass(kw_only=True)
class SftBatch:
    """One step of the supervised warm start (`sft.sft_batch`; the trainer's `sft_step`): B rows of
    prompt + target tokens, right-padded to T. Same layout as `TrainBatch` without the RL fields: the
    loss is masked next-token cross-entropy on the target tokens."""

    input_ids_BT: "torch.Tensor"
    """[B, T] int64 token ids (prompt followed by target)."""
    position_ids_BT: "torch.Tensor"
    """[B, T] int64 positions."""
    targets_BT: "torch.Tensor"
    """[B, T] int64: target token j at position P + j - 1 (predicted from there); 0 elsewhere."""
    loss_mask_BT: "torch.Tensor"
    """[B, T] float32: 1 at the target positions."""

    @property
    def num_rows(self) -> int:
        return int(self.input_ids_BT.shape[0])
