"""The local rollout engine: `GenerationCore` in its own process, served over multiprocessing queues.

Trainer process                                   engine process (spawned)
  LocalRolloutEngine.submit()  --("submit")-->      GenerationCore.add()
  LocalRolloutEngine.poll()    <--("done")---       GenerationCore.step() (batched decode loop)
  update_weights(): "init_group" once (rank 1 joins the SGLang-style group), then
      "weights_begin" -> per bucket "weights_bucket" + torch.distributed broadcast -> "weights_end"

`decode_stats()` asks the engine process for `GenerationCore.stats()` (cumulative work counters:
busy seconds, decode steps, decode tokens); it answers between two decode steps.

The engine applies a weight update between two decode steps: it stops stepping at
"weights_begin" (SGLang `pause_generation(in_place)` semantics), receives and checks bucket after
bucket, applies them all at "weights_end" and resumes with the new version; running requests keep
their KV cache (PipelineRL). A tensor with an unknown name or a wrong shape rejects the whole update:
nothing is applied, the engine keeps serving (and reporting) its previous version, and
`update_weights` raises WeightSyncError naming the tensor. The trainer side checks the whole update
against the engine model's names and shapes (`model_manifest`, a meta-device instantiation) before the
first bucket is sent, so such an update normally never reaches the engine; the engine's own staged
check remains the second line, and a tensor source that fails mid-update ("weights_abort") also
leaves the engine on its previous weights.
Every wait in either process has a deadline; an engine-side failure is sent back and re-raised by
the trainer as `EngineError`. The engine exits by itself (code `ORPHAN_EXIT_CODE`) within about
`LocalEngineConfig.parent_check_s` once the process that started it is gone (e.g. the trainer was
`kill -9`ed): it polls its parent pid in its loop, also while decoding and inside weight updates, and
in a watch thread (model build, blocking receives). It ignores SIGTERM and SIGINT (Slurm and a
terminal signal the whole step / process group): the trainer checkpoints first and then closes it
(`preemption.child_setup`).

Continuous batching: a slot KV cache (see `kv_cache.py`); finished requests free their slot and
waiting ones are prefilled into it at the next step. The engine process itself is engine_process.py; the model,
settings and requests it shares with this handle are local_spec.py.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scalerl_mega.interfaces import PAUSE_MODES
from scalerl_mega.preemption import start_child
from scalerl_mega.rollout import engine_process
from scalerl_mega.rollout.local_spec import (  # noqa: F401 - the local engine's public names, re-exported
    EngineError, LocalEngineConfig, LocalModelSpec, build_model, make_requests, model_manifest, request_seed)
from scalerl_mega.weight_sync import BucketMeta, WeightManifest, WeightSyncError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.types import Completion, Prompt, SamplingParams

log = logging.getLogger(__name__)

# ---- trainer-side handle -------------------------------------------------------------------------
class _PipeAnnouncer:
    def __init__(self, engine: "LocalRolloutEngine") -> None:
        self.engine = engine

    def begin(self, version: int) -> None:
        self.engine._send(("weights_begin", version))

    def announce(self, meta: BucketMeta):
        self.engine._send(("weights_bucket", meta))

        def wait(timeout_s: float) -> None:
            self.engine._wait_ack(("bucket", meta.index), timeout_s=timeout_s)

        return wait

    def abort(self, version: int) -> None:
        self.engine._send(("weights_abort", version))
        self.engine._wait_ack(("weights_abort", version), timeout_s=self.engine.config.sync.timeout_s)

    def end(self, version: int) -> None:
        self.engine._send(("weights_end", version))
        self.engine._wait_ack(("weights_end", version), timeout_s=self.engine.config.sync.timeout_s)
        why = self.engine._rejected.pop(version, None)
        if why is not None:
            raise WeightSyncError(f"engine rejected weight update v{version} ({why}); nothing was applied, it "
                                  f"keeps serving v{self.engine.version}")


class _AdapterAnnouncer(_PipeAnnouncer):
    """Opens the session as a LoRA adapter's (the engine loads the buckets' tensors as `policy-v{version}`)."""

    def __init__(self, engine: "LocalRolloutEngine", adapter_config: dict[str, object]) -> None:
        super().__init__(engine)
        self.adapter_config = adapter_config

    def begin(self, version: int) -> None:
        self.engine._send(("adapter_begin", version, self.adapter_config))


class LocalRolloutEngine:
    """`RolloutEngine` backed by a `GenerationCore` in a spawned process (see module doc)."""

    def __init__(self, config: LocalEngineConfig) -> None:
        import multiprocessing as mp

        self.config = config
        ctx = mp.get_context("spawn")
        self._cmd_q = ctx.Queue()
        self._out_q = ctx.Queue()
        self._proc = ctx.Process(
            target=engine_process._engine_main, args=(config, self._cmd_q, self._out_q, os.getpid()), name="scalerl-local-engine",
            daemon=True
        )
        start_child(self._proc)
        self._done: list[Completion] = []
        self._acks: list[Any] = []
        self._group = None
        self._sender = None
        self.version = 0
        self.last_sync_stats = None
        self._stats: dict[int, dict[str, float]] = {}
        self._stats_seq = 0
        self._rejected: dict[int, str] = {}
        self._manifest: WeightManifest | None = None
        self._wait_for(lambda m: m[0] == "ready", what="engine start", timeout_s=config.start_timeout_s)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    # ---- RolloutEngine ---------------------------------------------------------------------------
    def submit(self, prompt: "Prompt", sampling: "SamplingParams", *, n: int, version: int,
               first_index: int = 0) -> None:
        self._send(("submit", make_requests(prompt, sampling, n=n, version=version, base_seed=self.config.seed,
                                            first_index=first_index)))

    def poll(self, timeout_s: float = 0.0) -> list["Completion"]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._pump(timeout_s=0.0)
            if self._done or time.monotonic() >= deadline:
                break
            self._pump(timeout_s=min(0.05, max(deadline - time.monotonic(), 0.0)))
            if self._done:
                break
        if not self._done and not self._proc.is_alive():  # liveness on every wait (training and validation)
            self._pump(timeout_s=0.0)  # its last words (an "error" message) raise with the reason
            raise EngineError(f"engine process {self._proc.pid} is dead (exit code {self._proc.exitcode}) "
                              "while requests were waiting for it")
        out, self._done = self._done, []
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, version: int) -> None:
        """Broadcast HF-named weights to the engine process (bucketed, over gloo/NCCL). The whole
        update is first checked against the engine model's names and shapes (`model_manifest`): a
        mismatch raises WeightSyncError naming the tensor before anything is sent."""
        from scalerl_mega.weight_sync import DistWeightSender, checked_update

        if self._manifest is None:
            self._manifest = model_manifest(self.config.model)
        named_tensors = checked_update(named_tensors, self._manifest, version=version)
        if self._sender is None:
            self._init_group()
            self._sender = DistWeightSender(self._group, announcer=_PipeAnnouncer(self), config=self.config.sync)
        self.last_sync_stats = self._sender.send(named_tensors, version=version)
        self.version = version

    def update_adapter(self, adapter_config: dict[str, object], named_tensors: Iterable[tuple[str, "torch.Tensor"]], *,
                       version: int) -> None:
        """Send a PEFT LoRA adapter (config dict + `base_model.model.<module>.lora_A/B.weight` tensors) over the
        weight-sync group; the engine serves it as `policy-v{version}` to requests admitted from then on, running
        ones keeping theirs (`GenerationCore.load_adapter`). A bad adapter raises WeightSyncError naming the
        adapter and tensor, and the engine keeps serving its previous version. `last_sync_stats`: the adapter's
        bytes."""
        from scalerl_mega.weight_sync import DistWeightSender

        if self._group is None:
            self._init_group()
        sender = DistWeightSender(self._group, announcer=_AdapterAnnouncer(self, dict(adapter_config)),
                                  config=self.config.sync)
        self.last_sync_stats = sender.send(named_tensors, version=version)
        self.version = version

    # ---- multi-sender sync (weight_sync/multi.py): the controller joins the engine to every sender's group and
    # announces every group's buckets; the senders (trainer ranks) broadcast them
    @property
    def group_world_size(self) -> int:
        return 2  # the sender and this engine process

    def join_groups(self, init_methods: dict[str, str], *, rank: int = 1, world_size: int = 2) -> None:
        """Ask the engine to join each sender's group (as `rank` of `world_size`: 1 of 2 alone, i + 1 of n + 1 as
        engine i of n, `build.EngineSet`; the sender hosts `init_methods[name]` as rank 0 and joins
        meanwhile); `wait_groups` waits for it."""
        sync = self.config.sync
        self._send(("init_groups", {name: dict(backend=sync.backend, init_method=url, world_size=world_size, rank=rank,
                                               group_name=name, timeout_s=sync.timeout_s)
                                    for name, url in init_methods.items()}))

    def wait_groups(self) -> None:
        self._wait_ack("init_groups", timeout_s=self.config.sync.timeout_s * 2)

    def check_plan(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        """The manifest check of a whole multi-sender update, before the first byte (WeightSyncError)."""
        from scalerl_mega.weight_sync.multi import plan_specs

        if self._manifest is None:
            self._manifest = model_manifest(self.config.model)
        self._manifest.check(plan_specs(plan), version=version)

    def announce_groups(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        """Tell the engine every group's buckets (it starts receiving them all at once)."""
        self._send(("weights_multi", version, plan))

    def finish_groups(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        """Wait until the engine received every group (bounded: each bucket has the sync deadline);
        raise WeightSyncError naming the failed sender, bucket and tensor (nothing is applied then)."""
        most = max((len(m) for m in plan.values()), default=0)
        self._wait_ack(("weights_end", version), timeout_s=self.config.sync.timeout_s * (most + 1))
        why = self._rejected.pop(version, None)
        if why is not None:
            raise WeightSyncError(f"engine did not apply weight update v{version} ({why}); it keeps serving "
                                  f"v{self.version}")
        self.version = version

    def decode_stats(self) -> dict[str, float]:
        """The engine's cumulative work counters (`GenerationCore.stats()`): busy_s, decode_steps,
        decode_tokens, prefill_steps, prefill_tokens. Completions that arrive meanwhile are kept."""
        return self._request("stats")

    def weights_digest(self) -> dict[str, Any]:
        """`weight_sync.weights_sha256` of the weights the engine holds now, with their version (what
        a push delivered, checked against a reference export)."""
        return self._request("digest")

    def _request(self, kind: str) -> dict[str, Any]:
        self._stats_seq += 1
        token = self._stats_seq
        self._send((kind, token))
        deadline = time.monotonic() + self.config.reply_timeout_s
        while token not in self._stats:
            if time.monotonic() >= deadline:
                raise EngineError(f"engine did not answer a {kind} request within {self.config.reply_timeout_s}s")
            if not self._pump(timeout_s=0.1) and not self._proc.is_alive():
                raise EngineError(f"engine process died (exit code {self._proc.exitcode}) during a {kind} request")
        return self._stats.pop(token)

    def pause(self, mode: str = "in_place") -> None:
        """Stop decoding. in_place keeps running requests and their KV; retract re-queues them
        (KV recomputed after resume); abort returns them now with finish reason ABORT."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode={mode!r} must be one of {PAUSE_MODES}")
        self._send(("pause", mode))
        self._wait_ack("pause", timeout_s=self.config.reply_timeout_s)

    def resume(self) -> None:
        self._send(("resume",))
        self._wait_ack("resume", timeout_s=self.config.reply_timeout_s)

    def close(self) -> None:
        from scalerl_mega.weight_sync import destroy_group

        if self._proc.is_alive():
            try:
                self._cmd_q.put(("close",))
            except (ValueError, OSError) as exc:  # the queue is already closed: the kill below ends the child
                log.warning("local engine: close request not sent (%s); stopping the process", exc)
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout=5)
        if self._group is not None:
            destroy_group(self._group)
            self._group = None
        self._cmd_q.cancel_join_thread()
        self._out_q.cancel_join_thread()

    def __enter__(self) -> "LocalRolloutEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -------------------------------------------------------------------------------
    def _init_group(self) -> None:
        """SGLang order: tell the engine to join (no wait), join as rank 0, then wait for its ack."""
        from scalerl_mega.weight_sync import free_port, init_custom_process_group

        sync = self.config.sync
        port = free_port()
        init_method = f"tcp://{self.config.master_address}:{port}"
        common = dict(backend=sync.backend, init_method=init_method, world_size=2, group_name=sync.group_name)
        self._send(("init_group", dict(common, rank=1, timeout_s=sync.timeout_s)))
        self._group = init_custom_process_group(**common, rank=0, timeout_s=sync.timeout_s)
        self._wait_ack("init_group", timeout_s=sync.timeout_s)

    def _send(self, msg: tuple) -> None:
        if not self._proc.is_alive():
            self._pump(timeout_s=0.0)
            raise EngineError(f"engine process {self._proc.pid} is dead (exit code {self._proc.exitcode})")
        self._cmd_q.put(msg)

    def _pump(self, *, timeout_s: float) -> bool:
        """Read one message from the engine; False if none arrived."""
        try:
            msg = self._out_q.get(timeout=timeout_s) if timeout_s > 0 else self._out_q.get_nowait()
        except queue.Empty:
            return False
        if msg[0] == "done":
            self._done.extend(msg[1])
        elif msg[0] == "ack":
            self._acks.append(msg[1])
        elif msg[0] == "stats":
            self._stats[msg[1][0]] = msg[1][1]
        elif msg[0] == "weights_rejected":
            self._rejected[msg[1][0]] = msg[1][1]
        elif msg[0] == "error":
            raise EngineError(f"engine process failed: {msg[1]}")
        elif msg[0] == "ready":
            self._acks.append("ready")
        return True

    def _wait_for(self, pred, *, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                msg = self._out_q.get(timeout=0.1)
            except queue.Empty:
                if not self._proc.is_alive():
                    raise EngineError(f"{what}: engine process exited with code {self._proc.exitcode}") from None
                continue
            if msg[0] == "error":
                raise EngineError(f"{what}: engine process failed: {msg[1]}")
            if pred(msg):
                return
        raise EngineError(f"{what}: no answer within {timeout_s}s")

    def _wait_ack(self, ack: str | tuple[str, int], *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while ack not in self._acks:
            if time.monotonic() >= deadline:
                raise WeightSyncError(f"engine did not acknowledge {ack!r} within {timeout_s}s")
            if not self._pump(timeout_s=0.1) and not self._proc.is_alive():
                raise EngineError(f"engine process died (exit code {self._proc.exitcode}) while waiting for {ack!r}")
        self._acks.remove(ack)
