"""Roles of a multi-rank trainer job (README "One RL loop per job").

A ScaleRL trainer is one job of N ranks (torchrun / srun; paper App. A.3: 16 trainer GPUs). Global
rank 0 is the *controller*: it alone talks to the generators, scores rewards, samples prompts,
builds each step's batch, writes metrics and owns the loop's checkpoint extras. Every rank holds its
shard of the Megatron model. The other ranks are *followers*: they run `serve`, which executes the
controller's trainer calls on their shard in lock step:

    controller (ControllerTrainer)                 followers (serve)
    train_step(batch)   --"train_step" + batch-->  trainer.train_step(batch)   (each trains its DP shard)
    export_hf_weights() --"export" + dtype------>  exhaust trainer.export_hf_weights(dtype)  (TP/EP/PP gathers)
    export_adapter()    --"export_adapter"--->  trainer.export_adapter(dtype)  (peft=lora: TP/EP/PP gathers to rank 0)
    sync_weights(engine, version) --"sync"----->  sync.sync(version, dtype): its own share over its own group
                                                   (rollout.weight_sync_senders=per_stage; megatron/sync_senders.py)
    save(path, step, extra) --"save" + path, step-->  trainer.save(path, step)  (collective dist-checkpoint)
    load(path)          --"load" + path--------->  trainer.load(path)
    close()             --"stop"---------------->  return

Commands travel over a dedicated gloo group (CPU tensors are the right device for it on every
machine; NCCL would need CUDA tensors and has no usable per-call deadline), created with
`train.follower_timeout_s` as its timeout: followers wait that long for the next command while the
controller generates and scores. A batch is sent as a pickled skeleton plus one `broadcast` per
tensor (no pickling of large tensors). Metrics come back through the trainer itself: its step
all-reduces them over DP and broadcasts them from the last pipeline stage, so the controller's own
call returns the global values.

Failure: if the controller dies, followers see their gloo connection close and exit non-zero naming
rank 0; if a follower dies, the controller's next collective fails (gloo) and, under torchrun, the
elastic agent stops every rank and names the failed one. If the launcher itself dies (the torchrun
agent `kill -9`ed, a test's subprocess timeout), every rank of a multi-rank job exits within about a
second (`preemption.watch_parent`, started by `train.run_job`), and the processes the controller
started follow it: nothing waits out `train.follower_timeout_s` as an orphan. Nothing waits without
a deadline.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.interfaces import PolicyTrainer
    from scalerl_mega.weight_sync.multi import MultiSyncEngine
    from scalerl_mega.trainer.megatron.sync_senders import RankSync
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import TrainBatch

log = logging.getLogger("scalerl_mega.ranks")

CONTROLLER = 0
COMMANDS = ("train_step", "export", "export_adapter", "sync", "save", "load", "stop")


class RankFailure(RuntimeError):
    """A peer rank of the trainer job is gone or did not answer in time."""


@dataclasses.dataclass(frozen=True)
class _TensorSlot:
    index: int
    shape: tuple[int, ...]
    dtype: str


def _map(obj: object, leaf: type, fn: Callable[[Any], object]) -> Any:
    """`obj` with every value of type `leaf` replaced by `fn(value)`, through dicts, lists, tuples and
    dataclass instances (rebuilt with `dataclasses.replace`)."""
    if isinstance(obj, leaf):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map(v, leaf, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, leaf, fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _map(getattr(obj, f.name), leaf, fn)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def _split(obj: object, tensors: list[torch.Tensor]) -> Any:
    """obj with every tensor replaced by a `_TensorSlot` (tensors appended to `tensors`)."""
    import torch

    def slot(t):
        tensors.append(t.detach().contiguous())
        return _TensorSlot(len(tensors) - 1, tuple(t.shape), str(t.dtype).replace("torch.", ""))

    return _map(obj, torch.Tensor, slot)


def _join(obj: object, tensors: list[torch.Tensor]) -> Any:
    return _map(obj, _TensorSlot, lambda s: tensors[s.index])


def _slots(obj: object) -> list[_TensorSlot]:
    out: list[_TensorSlot] = []
    _map(obj, _TensorSlot, out.append)
    return sorted(out, key=lambda s: s.index)


class ControlChannel:
    """Controller -> followers command broadcast over a private gloo group (see module doc).
    Collective to construct: every rank of the default group must create it at the same point."""

    def __init__(self, *, timeout_s: float) -> None:
        import torch.distributed as dist

        if timeout_s <= 0:
            raise ValueError(f"train.follower_timeout_s={timeout_s} must be > 0")
        self.timeout_s = float(timeout_s)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))

    @property
    def is_controller(self) -> bool:
        return self.rank == CONTROLLER

    def share(self, value: object) -> Any:
        """Every rank returns the controller's `value` (a small picklable object), e.g. whether the
        run resumes, so that all ranks take the same branch."""
        import torch.distributed as dist

        holder = [value if self.is_controller else None]
        dist.broadcast_object_list(holder, src=CONTROLLER, group=self.group)
        return holder[0]

    def send(self, command: str, payload: object = None) -> None:
        """Controller: broadcast `command` and its payload (tensors sent one broadcast each)."""
        import torch.distributed as dist

        if command not in COMMANDS:
            raise ValueError(f"unknown trainer command {command!r}; expected one of {COMMANDS}")
        tensors: list = []
        skeleton = _split(payload, tensors)
        try:
            dist.broadcast_object_list([(command, skeleton)], src=CONTROLLER, group=self.group)
            for t in tensors:
                dist.broadcast(t.cpu() if t.device.type != "cpu" else t, src=CONTROLLER, group=self.group)
        except RuntimeError as exc:
            raise RankFailure(f"controller (rank {self.rank}): could not send {command!r} to the follower ranks "
                              f"1..{self.world_size - 1} (a trainer rank died or hung): {exc}") from exc

    def recv(self) -> tuple[str, Any]:
        """Follower: the next command and payload (waits up to `timeout_s`)."""
        import torch
        import torch.distributed as dist

        from scalerl_mega.weight_sync import dtype_from_name

        holder: list[Any] = [None]
        try:
            dist.broadcast_object_list(holder, src=CONTROLLER, group=self.group)
            command, skeleton = holder[0]
            tensors = []
            for slot in _slots(skeleton):
                t = torch.empty(slot.shape, dtype=dtype_from_name(slot.dtype))
                dist.broadcast(t, src=CONTROLLER, group=self.group)
                tensors.append(t)
        except RuntimeError as exc:
            raise RankFailure(f"trainer rank {self.rank}: lost the controller (rank {CONTROLLER}) or got no "
                              f"command within train.follower_timeout_s={self.timeout_s:g}s: {exc}") from exc
        return command, _join(skeleton, tensors)


class ControllerTrainer:
    """The PolicyTrainer the controller's loop drives: every call is first broadcast to the followers
    (which run it on their shards, `serve`), then run on the controller's own shard.

    Its surface is declared, not forwarded: `interfaces.PolicyTrainer` (`train_step`,
    `export_hf_weights`, `save`, `load`, one command each) plus `stop_followers` and `close`. Anything
    else of the trainer (a collective such as `logprobs` included) would run on the controller's shard
    alone while the followers wait for a command, so it is reached only explicitly via `.trainer`."""

    def __init__(self, trainer: MegatronPolicyTrainer, channel: ControlChannel, *, sync: RankSync | None = None) -> None:
        if not channel.is_controller:
            raise ValueError(f"ControllerTrainer on rank {channel.rank}: only rank {CONTROLLER} is the controller")
        self.trainer = trainer
        self.channel = channel
        self.sync = sync
        """The per-stage weight sync of every rank (None: the one-sender push through `export_hf_weights`)."""
        self._closed = False

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        self.channel.send("train_step", batch)
        return self.trainer.train_step(batch)

    def export_hf_weights(self, *, dtype: str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        self.channel.send("export", dtype)
        return self.trainer.export_hf_weights(dtype=dtype)

    def export_adapter(self, *, dtype: str | None = None) -> tuple[dict[str, object], list[tuple[str, torch.Tensor]]]:
        """`peft=lora`: the PEFT adapter on the controller (every rank gathers its share)."""
        self.channel.send("export_adapter", dtype)
        return self.trainer.export_adapter(dtype=dtype)

    def sync_weights(self, engine: MultiSyncEngine, *, version: int, dtype: str | None = None) -> dict[str, float]:
        """Every rank sends its share of weight version `version` to `engine` over its own group, the
        controller coordinating (`sync_senders.RankSync`); returns the `sync/*` metrics."""
        if self.sync is None:
            raise ValueError("sync_weights needs rollout.weight_sync_senders=per_stage (a RankSync on every rank)")
        self.channel.send("sync", (version, dtype))
        return self.sync.sync(version=version, dtype=dtype, engine=engine)

    def save(self, path: str, *, step: int | None = None, extra_state: dict[str, Any] | None = None) -> None:
        self.channel.send("save", (str(path), step))
        self.trainer.save(path, step=step, extra_state=extra_state)

    def load(self, path: str) -> dict[str, Any]:
        self.channel.send("load", str(path))
        return self.trainer.load(path)

    def stop_followers(self) -> None:
        """Release the followers from `serve` (normal end of the run)."""
        if not self._closed:
            self._closed = True
            self.channel.send("stop")

    def close(self) -> None:
        self.stop_followers()
        self.trainer.close()


def serve(trainer: PolicyTrainer, channel: ControlChannel, *, sync: RankSync | None = None) -> int:
    """Follower main loop: execute the controller's commands until "stop"; returns the number of
    train steps taken. Raises RankFailure when the controller is gone (the caller exits non-zero).
    `sync`: this rank's per-stage weight sync (needed for the "sync" command)."""
    if channel.is_controller:
        raise ValueError("serve() runs on follower ranks; rank 0 is the controller")
    steps = 0
    while True:
        command, payload = channel.recv()
        if command == "stop":
            return steps
        if command == "train_step":
            trainer.train_step(payload)
            steps += 1
        elif command == "export":
            for _ in trainer.export_hf_weights(dtype=payload):
                pass
        elif command == "export_adapter":
            trainer.export_adapter(dtype=payload)
        elif command == "sync":
            if sync is None:
                raise RankFailure(f"trainer rank {channel.rank}: the controller syncs per stage but this rank has no "
                                  "sender (rollout.weight_sync_senders differs between ranks)")
            version, dtype = payload
            sync.sync(version=version, dtype=dtype)
        elif command == "save":
            path, step = payload
            trainer.save(path, step=step, extra_state=None)
        elif command == "load":
            trainer.load(payload)
        else:  # pragma: no cover - send() refuses unknown commands
            raise RankFailure(f"trainer rank {channel.rank}: unknown command {command!r} from the controller")
