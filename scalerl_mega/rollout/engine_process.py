"""The local engine's process (`local.LocalRolloutEngine` spawns it): `GenerationCore` driven by commands from the
trainer's queue, weight updates between two decode steps (staged, checked, applied whole or not at all), and the
watch that makes it exit once the process that started it is gone (local.py's docstring tells the protocol)."""

from __future__ import annotations

import os
import queue
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any

from scalerl_mega.preemption import ORPHAN_EXIT_CODE, child_setup
from scalerl_mega.rollout.core import GenerationCore
from scalerl_mega.rollout.local_spec import LocalEngineConfig, build_model
from scalerl_mega.weight_sync import BucketMeta, WeightSyncError

if TYPE_CHECKING:  # pragma: no cover
    from multiprocessing.queues import Queue


def _engine_main(config: LocalEngineConfig, cmd_q: Queue, out_q: Queue, parent_pid: int) -> None:
    child_setup(parent_pid, name="local engine", every_s=config.parent_check_s)
    try:
        _EngineLoop(config, cmd_q, out_q, parent_pid=parent_pid).run()
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, then the process exits
        out_q.put(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None


class _ParentWatch:
    """Notices that the parent process is gone: re-parenting changes `os.getppid()` (the pid the
    parent had at spawn time is never our parent again, even if reused). Checks at most every `every_s`."""

    def __init__(self, parent_pid: int, *, every_s: float) -> None:
        self.parent_pid = parent_pid
        self.every_s = every_s
        self._next = 0.0

    def check(self) -> None:
        """Exit the process (ORPHAN_EXIT_CODE) if the parent died; cheap when called often."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        if os.getppid() != self.parent_pid:
            print(f"scalerl local engine {os.getpid()}: parent {self.parent_pid} is gone, exiting",
                  file=sys.stderr, flush=True)
            # no cleanup: nobody reads our queues any more (a queue's feeder thread could block the
            # normal exit on a full pipe) and the weight-sync peer is dead
            os._exit(ORPHAN_EXIT_CODE)


class _EngineLoop:
    def __init__(self, config: LocalEngineConfig, cmd_q: Queue, out_q: Queue, *, parent_pid: int) -> None:
        import torch

        self.watch = _ParentWatch(parent_pid, every_s=config.parent_check_s)
        self.watch.check()
        torch.set_num_threads(config.num_threads)
        if config.nice:
            os.nice(config.nice)
        self.config = config
        self.cmd_q = cmd_q
        self.out_q = out_q
        self.core = GenerationCore(build_model(config.model, device=config.device), config=config.core)
        self.paused = False
        self.group = None
        self.receiver = None
        self.multi: dict[str, Any] = {}
        """Multi-sender sync: group name -> (group, DistWeightReceiver)."""
        self.closing = False

    def run(self) -> None:
        self.out_q.put(("ready", {"vocab_size": self.core.vocab_size}))
        while not self.closing:
            self.watch.check()
            idle = self.paused or not self.core.can_progress()
            try:
                msg = self.cmd_q.get(timeout=0.2) if idle else self.cmd_q.get_nowait()
            except queue.Empty:
                msg = None
            while msg is not None and not self.closing:
                self._handle(msg)
                try:
                    msg = self.cmd_q.get_nowait()
                except queue.Empty:
                    msg = None
            if not self.closing and not self.paused and self.core.can_progress():
                done = self.core.step()
                if done:
                    self.out_q.put(("done", done))
        from scalerl_mega.weight_sync import destroy_group

        for group in [self.group] + [g for g, _ in self.multi.values()]:
            if group is not None:
                destroy_group(group)

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "submit":
            for req in msg[1]:
                self.core.add(req)
        elif kind == "pause":
            mode = msg[1]
            if mode == "abort":
                aborted = self.core.abort_all()
                if aborted:
                    self.out_q.put(("done", aborted))
            elif mode == "retract":
                self.core.retract_all()
            self.paused = True
            self.out_q.put(("ack", "pause"))
        elif kind == "resume":
            self.paused = False
            self.out_q.put(("ack", "resume"))
        elif kind == "init_group":
            from scalerl_mega.weight_sync import DistWeightReceiver, init_custom_process_group

            args = msg[1]
            self.group = init_custom_process_group(**args)
            self.receiver = DistWeightReceiver(
                self.group, timeout_s=self.config.sync.timeout_s, device=self.config.device
            )
            self.out_q.put(("ack", "init_group"))
        elif kind == "init_groups":  # multi-sender sync: one group per sender (weight_sync/plan.py)
            self._init_groups(msg[1])
        elif kind == "weights_multi":
            self._multi_session(*msg[1:])
        elif kind == "weights_begin":
            self._weight_session(msg[1])
        elif kind == "adapter_begin":  # a LoRA adapter: buckets as for weights, loaded whole at the end
            self._weight_session(msg[1], adapter_config=msg[2])
        elif kind == "stats":
            self.out_q.put(("stats", (msg[1], self.core.stats())))
        elif kind == "digest":
            from scalerl_mega.weight_sync import weights_sha256

            digest = weights_sha256(self.core.model.named_parameters())
            self.out_q.put(("stats", (msg[1], {"weights_sha256": digest, "version": self.core.version})))
        elif kind == "close":
            self.closing = True
        else:
            raise ValueError(f"engine: unknown command {kind!r}")

    def _weight_session(self, version: int, *, adapter_config: dict | None = None) -> None:
        """Block decoding; receive announced buckets until "weights_end" (deadline per message), then
        commit them all at once: as weights, or with `adapter_config` as the PEFT LoRA adapter
        `policy-v{version}` (`GenerationCore.load_adapter`, checked whole when complete).

        All-or-nothing: each bucket is checked (names, shapes) and staged as it arrives; a rejected
        tensor does not stop the session -- later buckets are still received, so the broadcast
        protocol stays in step with the trainer -- but nothing is applied, the engine keeps serving
        its current weights and version, and "weights_rejected" names the tensor to the trainer.
        (Staging holds one extra copy of the weights in the engine for the duration of the update.)"""
        if self.receiver is None:
            raise WeightSyncError("weights_begin before init_group: no weight-sync group")
        timeout = self.config.sync.timeout_s
        staged: list[tuple[str, Any, Any]] = []
        rejected: str | None = None
        while True:
            deadline = time.monotonic() + timeout
            msg = None
            while msg is None and time.monotonic() < deadline:
                self.watch.check()
                try:
                    msg = self.cmd_q.get(timeout=max(0.0, min(self.config.parent_check_s, deadline - time.monotonic())))
                except queue.Empty:
                    msg = None
            if msg is None:
                raise WeightSyncError(
                    f"engine: weight update v{version} stalled: no bucket or end message within {timeout}s; "
                    "the weights are partially updated, discard this engine"
                ) from None
            if msg[0] == "weights_bucket":
                meta: BucketMeta = msg[1]
                received = self.receiver.receive_bucket(meta)
                if rejected is None and adapter_config is not None:
                    staged += [(n, None, t.clone()) for n, t in received]
                elif rejected is None:
                    try:
                        # clone: a flattened bucket's tensors are views of a buffer reused by the next one
                        staged += [(n, p, t.clone()) for n, p, t in self.core.check_weights(received)]
                    except ValueError as e:
                        rejected = f"bucket {meta.index}: {e}"
                        staged.clear()
                self.out_q.put(("ack", ("bucket", meta.index)))
            elif msg[0] == "weights_abort":  # the trainer's tensor source failed: discard the update
                self.out_q.put(("ack", ("weights_abort", msg[1])))
                return
            elif msg[0] == "weights_end":
                if rejected is None and adapter_config is not None:
                    try:
                        self.core.load_adapter(adapter_config, [(n, t) for n, _, t in staged], version=msg[1])
                    except ValueError as e:
                        rejected = str(e)
                elif rejected is None:
                    self.core.load_weights((n, t) for n, _, t in staged)
                    self.core.set_version(msg[1])
                if rejected is not None:
                    self.out_q.put(("weights_rejected", (msg[1], rejected)))
                self.out_q.put(("ack", ("weights_end", msg[1])))
                return
            else:
                raise WeightSyncError(f"engine: unexpected {msg[0]!r} inside weight update v{version}")

    def _init_groups(self, groups: dict[str, dict]) -> None:
        """Join each sender's group (init_custom_process_group arguments by group name), in order; each
        sender hosts its group's store and joins at the same time, so every join has the sync deadline."""
        from scalerl_mega.weight_sync import DistWeightReceiver, init_custom_process_group

        for name, args in groups.items():
            if name not in self.multi:
                group = init_custom_process_group(**args)
                self.multi[name] = (group, DistWeightReceiver(group, timeout_s=self.config.sync.timeout_s,
                                                              device=self.config.device))
        self.out_q.put(("ack", "init_groups"))

    def _multi_session(self, version: int, plan: dict[str, list[BucketMeta]]) -> None:
        """Receive every sender's announced buckets at once (weight_sync.multi.receive_groups), staged and checked;
        apply them and the version only when every group delivered every bucket, else keep the current
        weights and report the failed sender, bucket and tensor ("weights_failed")."""
        from scalerl_mega.weight_sync.multi import receive_groups

        staged: list[tuple[str, Any]] = []
        rejected: list[str] = []

        def stage(group: str, meta: BucketMeta, received: list) -> None:
            if rejected:
                return
            try:
                staged.extend((n, t.clone()) for n, _, t in self.core.check_weights(received))
            except ValueError as e:
                rejected.append(f"sender {group!r} bucket {meta.index}: {e}")

        res = receive_groups({g: r for g, (_, r) in self.multi.items()}, plan, on_bucket=stage)
        problems = [f.describe() for f in res.failures] + rejected
        if problems:
            self.out_q.put(("weights_rejected", (version, "; ".join(problems))))
        else:
            self.core.load_weights(staged)
            self.core.set_version(version)
        self.out_q.put(("ack", ("weights_end", version)))
