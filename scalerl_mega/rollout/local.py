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
waiting ones are prefilled into it at the next step.
"""

from __future__ import annotations

import os
import queue
import sys
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalerl_mega.interfaces import PAUSE_MODES
from scalerl_mega.model.config import ARCHS
from scalerl_mega.preemption import ORPHAN_EXIT_CODE, child_setup, start_child
from scalerl_mega.rollout.core import CoreConfig, GenerationCore, GenRequest
from scalerl_mega.weight_sync import BucketMeta, WeightManifest, WeightSyncConfig, WeightSyncError

if TYPE_CHECKING:  # pragma: no cover
    from multiprocessing.queues import Queue

    import torch

    from scalerl_mega.types import Completion, Prompt, SamplingParams



class EngineError(RuntimeError):
    """The engine process failed or did not answer in time."""


@dataclass(kw_only=True)
class LocalModelSpec:
    """A model for the local engine: an HF config (tiny random models) or a local HF directory."""

    arch: str = "llama"
    """"llama" (LlamaForCausalLM), "llama4" (Llama4ForCausalLM, text only), "qwen3" (Qwen3ForCausalLM) or
    "qwen3_moe" (Qwen3MoeForCausalLM); model/archs.py."""
    config: dict[str, Any] | None = None
    """Keyword arguments of the architecture's config class (LlamaConfig, Llama4TextConfig, Qwen3Config,
    Qwen3MoeConfig; random init with `init_seed`)."""
    path: str | None = None
    """A local HF model directory (config.json + safetensors); overrides `config`."""
    dtype: str = "float32"
    init_seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"LocalModelSpec.arch={self.arch!r} must be one of {ARCHS}")
        if (self.config is None) == (self.path is None):
            raise ValueError("LocalModelSpec: give exactly one of config= or path=")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"LocalModelSpec.dtype={self.dtype!r} must be float32, bfloat16 or float16")


def build_model(spec: LocalModelSpec, *, device: str = "cpu") -> Any:
    """Instantiate the HF causal LM (eval mode, SDPA attention)."""
    import torch

    dtype = getattr(torch, spec.dtype)
    if spec.path is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=dtype, attn_implementation="sdpa")
    else:
        model_cls, cfg = _class_and_config(spec)
        with torch.random.fork_rng():
            torch.manual_seed(spec.init_seed)
            model = model_cls(cfg)
        model = model.to(dtype)
    return model.to(device).eval()


def _class_and_config(spec: LocalModelSpec) -> tuple[Any, Any]:
    """(HF model class, its config) for a spec given by config kwargs."""
    import transformers

    from scalerl_mega.model.archs import arch_of

    arch = arch_of(spec.arch, where="LocalModelSpec")
    Model, Cfg = getattr(transformers, arch.causal_lm), getattr(transformers, arch.config_class)
    cfg = Cfg(**spec.config)
    cfg._attn_implementation = "sdpa"
    return Model, cfg


def model_manifest(spec: LocalModelSpec) -> "WeightManifest":
    """The checkpoint names and shapes of the model `spec` describes (`weight_sync.WeightManifest`; the
    names weights travel under, `hf_params.checkpoint_manifest`), from its HF class instantiated on the
    meta device: no weights are read or allocated."""
    import torch

    from scalerl_mega.rollout.hf_params import checkpoint_manifest

    with torch.device("meta"):
        if spec.path is not None:
            from transformers import AutoConfig, AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec.path))
            source = f"HF model at {spec.path}"
        else:
            model_cls, cfg = _class_and_config(spec)
            model = model_cls(cfg)
            source = f"{model_cls.__name__} from its config"
    return checkpoint_manifest(model, source=source)


@dataclass(kw_only=True)
class LocalEngineConfig:
    model: LocalModelSpec
    core: CoreConfig = field(default_factory=CoreConfig)
    sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    num_threads: int = 1
    """torch threads in the engine process (1 is fastest on a contended 2-core machine)."""
    nice: int = 0
    """Added to the engine process's CPU niceness when it starts (`os.nice`; 0-19). Where the trainer and the
    engines share too few cores, a positive value lets the trainer run whenever it has work (its step is the
    one the engines wait on) and gives the engines the rest; 0 leaves the scheduler's even split."""
    seed: int = 0
    """Seeds requests submitted without `SamplingParams.seed`."""
    device: str = "cpu"
    master_address: str = "127.0.0.1"
    start_timeout_s: float = 180.0
    reply_timeout_s: float = 120.0
    parent_check_s: float = 1.0
    """How often the engine process checks that its parent is still alive (it exits if not)."""

    def __post_init__(self) -> None:
        if self.num_threads < 1:
            raise ValueError(f"LocalEngineConfig.num_threads={self.num_threads} must be >= 1")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"LocalEngineConfig.nice={self.nice} must be in 0..19")
        if not self.parent_check_s > 0:
            raise ValueError(f"LocalEngineConfig.parent_check_s={self.parent_check_s} must be > 0")


def request_seed(base: int, prompt_id: str, index: int) -> int:
    """A stable per-sample seed for requests submitted without one."""
    import hashlib

    h = hashlib.blake2b(f"{base}/{prompt_id}".encode(), digest_size=7).digest()
    return int.from_bytes(h, "little") + index


def make_requests(
    prompt: "Prompt", sampling: "SamplingParams", *, n: int, version: int, base_seed: int, first_index: int = 0
) -> list[GenRequest]:
    """The n samples of a prompt, sample indices `first_index` + j for j < n: the j-th gets seed + j
    (SGLang `sampling_seed`, slime's scheme; `sampling.seed` is the first one's), or without a seed
    `request_seed` of its sample index. Request ids `<prompt_id>/<sample index>/v<version>`."""
    if prompt.token_ids is None:
        raise ValueError(f"prompt {prompt.prompt_id}: token_ids is None (tokenise before submit)")
    if n < 1:
        raise ValueError(f"submit n={n} must be >= 1")
    if first_index < 0:
        raise ValueError(f"submit first_index={first_index} must be >= 0")
    out = []
    for j in range(n):
        i = first_index + j
        seed = sampling.seed + j if sampling.seed is not None else request_seed(base_seed, prompt.prompt_id, i)
        out.append(
            GenRequest(
                rid=f"{prompt.prompt_id}/{i}/v{version}",
                prompt_id=prompt.prompt_id,
                sample_index=i,
                prompt_ids=list(prompt.token_ids),
                sampling=sampling,
                seed=seed,
                submitted_version=version,
            )
        )
    return out


# ---- engine process ---------------------------------------------------------------------------
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
        if self.group is not None:
            from scalerl_mega.weight_sync import destroy_group

            destroy_group(self.group)

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
        elif kind == "weights_begin":
            self._weight_session(msg[1])
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

    def _weight_session(self, version: int) -> None:
        """Block decoding; receive announced buckets until "weights_end" (deadline per message), then
        commit them all at once.

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
                if rejected is None:
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
                if rejected is None:
                    self.core.load_weights((n, t) for n, _, t in staged)
                    self.core.set_version(msg[1])
                else:
                    self.out_q.put(("weights_rejected", (msg[1], rejected)))
                self.out_q.put(("ack", ("weights_end", msg[1])))
                return
            else:
                raise WeightSyncError(f"engine: unexpected {msg[0]!r} inside weight update v{version}")


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


class LocalRolloutEngine:
    """`RolloutEngine` backed by a `GenerationCore` in a spawned process (see module doc)."""

    def __init__(self, config: LocalEngineConfig) -> None:
        import multiprocessing as mp

        self.config = config
        ctx = mp.get_context("spawn")
        self._cmd_q = ctx.Queue()
        self._out_q = ctx.Queue()
        self._proc = ctx.Process(
            target=_engine_main, args=(config, self._cmd_q, self._out_q, os.getpid()), name="scalerl-local-engine",
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
            except Exception:  # noqa: BLE001
                pass
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
