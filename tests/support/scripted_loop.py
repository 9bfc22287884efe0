"""Stand-ins for the RL loop's engine, trainer, sampler and reward whose interleaving a test forces: the engine
completes requests in submission order, one per `poll`, and logs submissions, deliveries and weight updates
(tests/unit/test_loop_phases.py, tests/unit/test_val_window.py)."""

from __future__ import annotations

import copy
from collections import deque
from pathlib import Path

from scalerl_mega.types import Completion, FinishReason, Prompt


class ScriptedEngine:
    """Completes requests in submission order, one per `poll`; logs submissions, deliveries and weight updates."""

    def __init__(self, *, stamp_version: bool = False):
        self.stamp_version = stamp_version
        """Completions carry the delivering weight version as their second token (100 + version)."""
        self.version = 0
        self.todo: deque = deque()
        self.log: list[tuple] = []

    def submit(self, prompt, sampling, *, n, version, first_index=0):
        self.todo.append((prompt, version, first_index))
        self.log.append(("submit", f"{prompt.prompt_id}#s{first_index}", version))

    def poll(self, timeout_s=0.0):
        if not self.todo:
            return []
        prompt, version, idx = self.todo.popleft()
        self.log.append(("deliver", f"{prompt.prompt_id}#s{idx}", self.version))
        out = [idx + 1, 100 + self.version, 7] if self.stamp_version else [idx + 1, 7]
        return [Completion(prompt_id=prompt.prompt_id, sample_index=idx, prompt_ids=list(prompt.token_ids),
                           output_ids=out, gen_logprobs=[-0.5] * len(out), weight_versions=[self.version] * len(out),
                           finish_reason=FinishReason.STOP, submitted_version=version)]

    def update_weights(self, named_tensors, *, version):
        list(named_tensors)
        self.version = version
        self.log.append(("update", version))

    def pause(self): ...
    def resume(self): ...
    def close(self): ...


class RecordingTrainer:
    def __init__(self, engine: ScriptedEngine, saved: dict | None = None):
        self.engine = engine
        self.saved = saved
        """path -> extra_state of `save` (a dict shared by the launches of one run); None: saving is an error."""

    def train_step(self, batch):
        self.engine.log.append(("train", len(self.engine.todo)))
        return {"loss": 0.0}

    def export_hf_weights(self, *, dtype=None):
        return iter(())

    def save(self, path, *, step=None, extra_state=None):
        if self.saved is None:
            raise AssertionError("no checkpoint expected")
        self.saved[path] = copy.deepcopy(extra_state)
        Path(path).mkdir(parents=True, exist_ok=True)  # what loop.latest_checkpoint looks for
        (Path(path) / "saved").write_text("scripted")

    def load(self, path):
        if not self.saved:
            raise AssertionError("no checkpoint expected")
        return copy.deepcopy(self.saved[path])


class Sampler:
    def __init__(self):
        self.n = 0

    def next_prompts(self, n):
        out = [Prompt(prompt_id=f"t{self.n + i}", text="q", task="synthetic", gold="") for i in range(n)]
        self.n += n
        return out

    def record(self, prompt_id, pass_rate): ...
    def state_dict(self): return {"n": self.n}
    def load_state_dict(self, state): self.n = state["n"]


def reward(prompts, texts):  # sample 0 passes, sample 1 fails: every group has signal
    return [(1.0, True, "") if t.startswith("\x01") else (0.0, False, "") for t in texts]
