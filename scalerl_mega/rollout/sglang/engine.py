"""`SGLangRolloutEngine`: the `RolloutEngine` over SGLang servers -- /generate dispatch (least loaded
server, forced interruption in two requests, routes), restarts of dead launched servers, and the
weight-update sequence of the package doc (pause, session, group, buckets, resume)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalerl_mega.rollout.core import GenRequest
from scalerl_mega.rollout.sglang.adapters import ServedAdapters
from scalerl_mega.rollout.sglang.async_client import AsyncGenerateClient, AsyncHttp
from scalerl_mega.rollout.sglang.client import PAUSE_MODES, BodyHook, SGLangClient, SGLangError, ServerDown
from scalerl_mega.rollout.sglang.generate import (
    RouteLayout,
    completion_routes,
    finish_reason,
    parse_generate_response,
    sglang_sampling_params,
)
from scalerl_mega.rollout.sglang.launch import IN_PLACE_FLAGS, SGLangServer
from scalerl_mega.weight_sync import BucketMeta, WeightSyncConfig, WeightSyncError
from scalerl_mega.types import Completion, FinishReason

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.rollout.local import LocalModelSpec
    from scalerl_mega.rollout.sglang.multi_groups import SGLangGroups
    from scalerl_mega.weight_sync import WeightManifest
    from scalerl_mega.types import Prompt, SamplingParams


@dataclass(kw_only=True)
class SGLangEngineConfig:
    pause_mode: str = "in_place"
    """in_place for PipelineRL; retract or abort for PPO-off-policy."""
    sync: WeightSyncConfig = field(default_factory=lambda: WeightSyncConfig(backend="nccl"))
    master_address: str = "127.0.0.1"
    max_inflight_per_server: int = 256
    """/generate requests kept in flight on each server (`rollout.max_batch_size`): the engine keeps
    up to servers x this many in flight (the fleet's running batch: 64 generators x 256 = 16,384),
    each a pooled connection on one event-loop thread; the rest wait client-side."""
    request_timeout_s: float = 3600.0
    control_timeout_s: float = 300.0
    seed: int = 0
    initial_version: int = 0
    max_restarts: int = 3
    routes: RouteLayout | None = None
    """Request and decode the MoE routes of every sample (`Completion.routes`); None: not requested."""
    model: "LocalModelSpec | None" = None
    """`rollout.local.LocalModelSpec` of the model the servers serve (HF config kwargs or a local HF
    directory): the names and shapes every update is checked against before the first bucket. None:
    the `model_path` of a launched server, or the one an attached server reports (/model_info) if it
    is a local directory with a config.json; without either there is no pre-send check."""
    adapter_dir: str | None = None
    """LoRA adapters (`update_adapter`): None sends each one in the request body (`/load_lora_adapter_from_tensors`);
    a directory every server reads (shared storage) gets each version written in PEFT format and loaded by path
    (`/load_lora_adapter`). rollout/sglang/adapters.py."""

    def __post_init__(self) -> None:
        if self.pause_mode not in PAUSE_MODES:
            raise ValueError(f"SGLangEngineConfig.pause_mode={self.pause_mode!r} must be one of {PAUSE_MODES}")
        if isinstance(self.max_inflight_per_server, bool) or not (
                isinstance(self.max_inflight_per_server, int) and self.max_inflight_per_server >= 1):
            raise ValueError(f"SGLangEngineConfig.max_inflight_per_server={self.max_inflight_per_server!r} "
                             "(rollout.max_batch_size) must be an integer >= 1")


class _HttpAnnouncer:
    def __init__(self, engine: "SGLangRolloutEngine", *, flush_cache: bool) -> None:
        self.engine = engine
        self.flush_cache = flush_cache

    def begin(self, version: int) -> None:
        return None

    def announce(self, meta: BucketMeta):
        eng = self.engine
        futs = [
            eng._ctl_pool.submit(
                c.update_weights_from_distributed, meta, group_name=eng.config.sync.group_name, flush_cache=self.flush_cache
            )
            for c in eng._ctl_clients
        ]

        def wait(timeout_s: float) -> None:
            _wait_futures(futs, what=f"update_weights_from_distributed bucket {meta.index}", timeout_s=timeout_s)

        return wait

    def end(self, version: int) -> None:
        return None


def _wait_futures(futs: list[Future], *, what: str, timeout_s: float) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    out = []
    for f in futs:
        try:
            out.append(f.result(timeout=max(deadline - time.monotonic(), 0.001)))
        except TimeoutError:
            raise WeightSyncError(f"{what}: no reply within {timeout_s}s") from None
        except SGLangError as e:
            raise WeightSyncError(f"{what}: {e}") from e
    return out


class SGLangRolloutEngine:
    """`RolloutEngine` over one or more SGLang servers (HTTP /generate, distributed weight sync)."""

    def __init__(
        self, servers: list[SGLangServer], *, config: SGLangEngineConfig, body_hook: BodyHook | None = None
    ) -> None:
        if not servers:
            raise ValueError("SGLangRolloutEngine needs at least one server")
        self.servers = servers
        self.config = config
        self.body_hook = body_hook
        self.max_concurrency = config.max_inflight_per_server * len(servers)
        """/generate requests in flight at most: servers x `max_inflight_per_server`."""
        _ensure_open_files(self.max_concurrency + 256, what=f"{len(servers)} server(s) x "
                           f"SGLangEngineConfig.max_inflight_per_server={config.max_inflight_per_server} "
                           "(rollout.max_batch_size) connections")
        self._ctl_clients = [
            SGLangClient(s.url, timeout_s=config.control_timeout_s, body_hook=body_hook) for s in servers
        ]
        self._http = AsyncHttp(timeout_s=config.request_timeout_s)
        self._clients = [AsyncGenerateClient(s.url, http=self._http, max_inflight=config.max_inflight_per_server,
                                             body_hook=body_hook) for s in servers]
        self._ctl_pool = ThreadPoolExecutor(max_workers=max(4, 2 * len(servers)), thread_name_prefix="sglang-ctl")
        self._lock = threading.Lock()
        self._inflight: dict[Future, tuple[int, GenRequest]] = {}
        self._finished: queue.SimpleQueue[Future] = queue.SimpleQueue()
        self._load = [0] * len(servers)
        self._done: list[Completion] = []
        self._group = None
        self._regroup = False
        self._stale: set[int] = set()
        self.version = config.initial_version
        self.last_sync_stats = None
        self._manifest: "WeightManifest | None" = None
        self._manifest_known = False
        self._in_place_checked = False
        self._groups: "SGLangGroups | None" = None
        self._adapters = ServedAdapters()
        self._adapter_load = None
        """How the current adapter reaches a server, fn(client, server): reloaded after a restart."""

    # ---- RolloutEngine ---------------------------------------------------------------------------
    def submit(self, prompt: "Prompt", sampling: "SamplingParams", *, n: int, version: int,
               first_index: int = 0) -> None:
        from scalerl_mega.rollout.local import make_requests

        for req in make_requests(prompt, sampling, n=n, version=version, base_seed=self.config.seed,
                                 first_index=first_index):
            self._dispatch(req)

    def poll(self, timeout_s: float = 0.0) -> list[Completion]:
        finished = []
        with self._lock:
            busy = bool(self._inflight)
        if busy and not self._done and timeout_s > 0:
            try:  # requests finish in the loop thread, which queues their futures (`_dispatch`)
                finished.append(self._finished.get(timeout=timeout_s))
            except queue.Empty:
                pass
        while True:
            try:
                finished.append(self._finished.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            items = [(f, self._inflight.pop(f)) for f in finished if f in self._inflight]
            for _, (si, _) in items:
                self._load[si] -= 1
        for f, (si, req) in items:
            try:
                self._done.append(f.result())
            except ServerDown:
                self._recover(si)
                self._dispatch(req)
        out, self._done = self._done, []
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]], *, version: int) -> None:
        from scalerl_mega.weight_sync import DistWeightSender, checked_update

        # checked whole before the servers are paused: a rejected update never pauses generation
        named_tensors = checked_update(named_tensors, self.manifest(), version=version)
        mode = self.config.pause_mode
        if mode == "in_place" and not self._in_place_checked:
            self._check_in_place_flags()
        t = self.config.control_timeout_s
        self._fan_out(lambda c: c.pause_generation(mode), what=f"pause_generation({mode})", timeout_s=t)
        self._fan_out(lambda c: c.begin_weight_update(), what="begin_weight_update", timeout_s=t)
        rejected = False
        try:
            if self._regroup:
                self._destroy_groups()
            if self._group is None:
                self._init_group()
            sender = DistWeightSender(
                self._group, announcer=_HttpAnnouncer(self, flush_cache=mode != "in_place"), config=self.config.sync
            )
            self.last_sync_stats = sender.send(named_tensors, version=version)
        except WeightSyncError:  # e.g. a rejected name/shape: resume below, never leave the servers paused
            rejected = True
            raise
        finally:
            self._fan_out(lambda c: c.end_weight_update(), what="end_weight_update", timeout_s=t)
            if rejected:
                self._fan_out(lambda c: c.continue_generation(), what="continue_generation", timeout_s=t)
        self._fan_out(lambda c: c.continue_generation(), what="continue_generation", timeout_s=t)
        self.version = version
        self._stale.clear()

    def update_adapter(self, adapter_config: dict[str, object], named_tensors: Iterable[tuple[str, "torch.Tensor"]], *,
                       version: int) -> None:
        """Load the PEFT LoRA adapter `policy-v{version}` on every server (rollout/sglang/adapters.py); samples
        started from now on name it (`lora_path`), running ones keep theirs, and the previous version is unloaded
        once its last sample ends. Checked first against the served model's linears (WeightSyncError naming the
        adapter and tensor, nothing sent); a server refusing it raises WeightSyncError naming the server, the
        adapter is unloaded from the others and the previous version keeps serving."""
        import os

        from scalerl_mega.rollout.lora import adapter_name, check_adapter
        from scalerl_mega.rollout.sglang.adapters import manifest_linears, tensors_payload, write_peft_dir
        from scalerl_mega.weight_sync import SendStats

        t0 = time.monotonic()
        name, serving = adapter_name(version), (self._adapters.current or ("the base model",))[0]
        tensors = [(n, t.detach()) for n, t in named_tensors]
        manifest = self.manifest()
        if manifest is not None:
            try:
                check_adapter(adapter_config, tensors, manifest_linears(manifest), version=version, where=manifest.source)
            except ValueError as e:
                raise WeightSyncError(f"SGLang engine: {e}; nothing was sent, the servers keep serving {serving}") from None
        if self.config.adapter_dir is not None:
            path = os.path.join(self.config.adapter_dir, name)
            write_peft_dir(path, adapter_config, tensors)
            load = lambda c, s: c.load_lora_adapter(name, path)  # noqa: E731
        else:
            payload = tensors_payload(tensors)
            load = lambda c, s: c.load_lora_adapter_from_tensors(name, dict(adapter_config), [payload] * s.tp_size)  # noqa: E731
        futs = [self._ctl_pool.submit(load, c, s) for c, s in zip(self._ctl_clients, self.servers)]
        failed = []
        for f, server in zip(futs, self.servers):
            try:
                _wait_futures([f], what=f"load adapter {name!r} on {server.url}", timeout_s=self.config.control_timeout_s)
            except WeightSyncError as e:
                failed.append(str(e))
        if failed:
            self._unload_later(name, only=[c for c, f in zip(self._ctl_clients, futs) if f.done() and f.exception() is None])
            raise WeightSyncError(f"SGLang did not load adapter {name!r} ({'; '.join(failed)}); the servers keep "
                                  f"serving {serving}")
        self._adapter_load = load
        gone = self._adapters.switch(name, version)
        if gone is not None:
            self._unload_later(gone)
        self.version = version
        self.last_sync_stats = SendStats(version=version, buckets=1, tensors=len(tensors), seconds=time.monotonic() - t0,
                                         bytes=sum(t.numel() * t.element_size() for _, t in tensors))

    def _unload_later(self, name: str, *, only: list[SGLangClient] | None = None) -> None:
        """Unload adapter `name` from every server (or `only` these) on the control pool, without waiting; failures
        are logged (a server that lost it, e.g. restarted, has nothing to unload)."""
        import logging
        import os
        import shutil

        def run() -> None:
            for c in self._ctl_clients if only is None else only:
                try:
                    c.unload_lora_adapter(name)
                except SGLangError as e:
                    logging.getLogger(__name__).warning("SGLang %s: unloading adapter %r failed: %s", c.url, name, e)
            if self.config.adapter_dir is not None and only is None:
                shutil.rmtree(os.path.join(self.config.adapter_dir, name), ignore_errors=True)

        try:
            self._ctl_pool.submit(run)
        except RuntimeError:  # the engine is closing: the servers go with it
            pass

    # ---- multi-sender sync (weight_sync.multi.MultiSyncEngine; rollout/sglang/multi_groups.py)
    @property
    def groups(self) -> "SGLangGroups":
        from scalerl_mega.rollout.sglang.multi_groups import SGLangGroups

        if self._groups is None:
            self._groups = SGLangGroups(self)
        return self._groups

    @property
    def group_world_size(self) -> int:
        """Ranks of each sender's group: the sender and every server's TP ranks."""
        return self.groups.world_size

    def join_groups(self, init_methods: dict[str, str]) -> None:
        self.groups.join(init_methods)

    def wait_groups(self) -> None:
        self.groups.wait_joined()

    def check_plan(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        self.groups.check(plan, version=version)

    def announce_groups(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        self.groups.announce(plan, version=version)

    def finish_groups(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        self.groups.finish(plan, version=version)

    def _check_served_models(self, spec: "LocalModelSpec") -> None:
        """Attached servers: compare the architecture in the config.json of the checkpoint each one
        reports serving (`/model_info` `model_path`, when readable here) with the model the updates are
        built for (`spec`, the trainer's twin); WeightSyncError naming the server and every differing
        field before anything is sent. Unreadable paths are logged and skipped."""
        import json
        import logging
        import os

        from scalerl_mega.model.hf_import import config_mismatches
        from scalerl_mega.weight_sync import WeightSyncError

        from scalerl_mega.model.archs import arch_of

        ours = {"model_type": arch_of(spec.arch).model_type, **spec.config}
        for server, client in zip(self.servers, self._ctl_clients):
            if server.config is not None:  # launched here from the trainer's own export
                continue
            path = str(client.model_info().get("model_path") or "")
            cfg_file = os.path.join(path, "config.json")
            if not os.path.isfile(cfg_file):
                logging.getLogger(__name__).info("SGLang server %s serves %r: no config.json readable here, its "
                                                 "architecture is not checked against the trainer's", server.url, path)
                continue
            with open(cfg_file) as f:
                bad = config_mismatches(json.load(f), ours, where=cfg_file)
            if bad:
                raise WeightSyncError(f"SGLang server {server.url} serves {path}, not the trainer's model "
                                      f"({len(bad)} field(s)): " + "; ".join(bad) + "; nothing was sent")

    def _check_in_place_flags(self) -> None:
        """in_place updates need every server launched with `IN_PLACE_FLAGS` (`/server_info`); raise
        SGLangError naming the server and the missing flags before anything is paused."""
        infos = self._fan_out(lambda c: c.server_info(), what="server_info", timeout_s=self.config.control_timeout_s)
        for server, info in zip(self.servers, infos):
            missing = [flag for flag, key in IN_PLACE_FLAGS.items() if not (info or {}).get(key)]
            if missing:
                raise SGLangError(
                    f"SGLang server {server.url} runs without {' '.join(missing)}: with "
                    f"SGLangEngineConfig.pause_mode='in_place' its updates would reuse KV of the old weights for "
                    f"shared prefixes and tag versions one token early; relaunch it with these flags "
                    f"(SGLangServerConfig.pause_mode='in_place' adds them) or use pause_mode 'retract'")
        self._in_place_checked = True

    def manifest(self) -> "WeightManifest | None":
        """The served model's `WeightManifest` (cached), or None when it cannot be known here. With
        `config.model` given, attached servers are first checked to serve that architecture."""
        import logging
        import os

        from scalerl_mega.rollout.local import LocalModelSpec, model_manifest

        if not self._manifest_known:
            spec = self.config.model
            if spec is not None and spec.config is not None:
                self._check_served_models(spec)
            if spec is None:
                s0 = self.servers[0]
                path = s0.config.model_path if s0.config is not None else self._ctl_clients[0].model_info().get("model_path")
                if path and os.path.isfile(os.path.join(str(path), "config.json")):
                    spec = LocalModelSpec(path=str(path))
            if spec is None:
                logging.getLogger(__name__).warning(
                    "SGLang engine: the served model is unknown here (no SGLangEngineConfig.model, no local model_path); "
                    "weight updates are not checked before sending, a wrong tensor can leave earlier buckets applied")
            self._manifest = model_manifest(spec) if spec is not None else None
            self._manifest_known = True
        return self._manifest

    def pause(self, mode: str | None = None) -> None:
        m = mode or self.config.pause_mode
        self._fan_out(lambda c: c.pause_generation(m), what="pause_generation", timeout_s=self.config.control_timeout_s)

    def resume(self) -> None:
        self._fan_out(lambda c: c.continue_generation(), what="continue_generation", timeout_s=self.config.control_timeout_s)

    def close(self) -> None:
        from scalerl_mega.weight_sync import destroy_group

        if self._groups is not None:
            self._groups.close()
        self._http.close()  # cancels the requests still in flight, closes their sockets, joins the loop thread
        self._ctl_pool.shutdown(wait=False, cancel_futures=True)
        if self._group is not None:
            destroy_group(self._group)
            self._group = None

    # ---- internals -------------------------------------------------------------------------------
    def _fan_out(self, fn, *, what: str, timeout_s: float) -> list[Any]:
        futs = [self._ctl_pool.submit(fn, c) for c in self._ctl_clients]
        return _wait_futures(futs, what=what, timeout_s=timeout_s)

    def _destroy_groups(self) -> None:
        """Tear the weight-sync group down everywhere (after a server restart)."""
        from scalerl_mega.weight_sync import destroy_group

        name = self.config.sync.group_name
        futs = [self._ctl_pool.submit(c.destroy_weights_update_group, name) for c in self._ctl_clients]
        for f in futs:
            try:
                f.result(timeout=self.config.control_timeout_s)
            except SGLangError:
                pass  # the restarted server has no group
        if self._group is not None:
            destroy_group(self._group)
        self._group = None
        self._regroup = False

    def _init_group(self) -> None:
        """Fire /init_weights_update_group to all servers (no wait), join as rank 0, then wait."""
        from scalerl_mega.weight_sync import engine_rank_offsets, free_port, init_custom_process_group

        sync = self.config.sync
        world_size, offsets = engine_rank_offsets([s.tp_size for s in self.servers])
        port = free_port()
        futs = [
            self._ctl_pool.submit(
                c.init_weights_update_group,
                master_address=self.config.master_address,
                master_port=port,
                rank_offset=off,
                world_size=world_size,
                group_name=sync.group_name,
                backend=sync.backend,
            )
            for c, off in zip(self._ctl_clients, offsets)
        ]
        self._group = init_custom_process_group(
            backend=sync.backend,
            init_method=f"tcp://{self.config.master_address}:{port}",
            world_size=world_size,
            rank=0,
            group_name=sync.group_name,
            timeout_s=sync.timeout_s,
        )
        _wait_futures(futs, what="init_weights_update_group", timeout_s=sync.timeout_s)

    def _dispatch(self, req: GenRequest) -> None:
        with self._lock:
            # prefer servers holding the synced weights over ones relaunched since the last sync
            live = [i for i in range(len(self.servers)) if i not in self._stale] or list(range(len(self.servers)))
            si = min(live, key=lambda i: self._load[i])
            self._load[si] += 1
            fut = self._http.submit(self._agenerate(self._clients[si], req))
            self._inflight[fut] = (si, req)
        fut.add_done_callback(self._finished.put)

    def _recover(self, si: int) -> None:
        """A request failed with a dead connection: restart the server if we launched it (its
        in-flight requests fail the same way and are re-queued one by one by `poll`)."""
        server = self.servers[si]
        with self._lock:
            if server.alive():
                return
            if not server.restartable or server.restarts >= self.config.max_restarts:
                raise ServerDown(f"SGLang server {server.url} is down and cannot be restarted")
            server.restart()
            if self._adapter_load is not None:  # it lost its adapters: new samples run with the current one
                self._adapter_load(self._ctl_clients[si], server)
            # its weight-sync rank left the group: rebuild the group (on every server) at the next
            # update. Until then new requests prefer servers holding the synced weights; if the
            # restarted server is the only one, it generates with its launch weights and its tokens
            # carry that version (weight_versions), so staleness accounting stays exact.
            self._regroup = True
            self._stale.add(si)

    def _generate(self, client: AsyncGenerateClient, req: GenRequest) -> Completion:
        """One sample, blocking (on the engine's loop thread): what `submit` runs for each request."""
        return self._http.submit(self._agenerate(client, req)).result()

    async def _agenerate(self, client: AsyncGenerateClient, req: GenRequest) -> Completion:
        async with client.slots:  # held across both requests of an interrupted sample
            lora = self._adapters.acquire()  # the adapter of the whole sample, held until it ends
            try:
                c = await self._sample(client, req, lora=lora and lora[0])
                if lora is not None:  # its version tags every token (the servers' own version is the base's)
                    c.weight_versions = [lora[1]] * len(c.weight_versions)
                    if c.routes is not None:
                        c.routes.versions = [lora[1]] * len(c.routes.versions)
                return c
            finally:
                gone = None if lora is None else self._adapters.release(lora[0])
                if gone is not None:
                    self._unload_later(gone)

    async def _sample(self, client: AsyncGenerateClient, req: GenRequest, *, lora: str | None = None) -> Completion:
        """One sample (two requests if interrupted, both naming the LoRA adapter `lora` if given)."""
        sp = req.sampling
        t0 = time.monotonic()
        init = self.config.initial_version
        interrupt = sp.interruption_at is not None and sp.interruption_at <= sp.max_new_tokens
        think_budget = sp.interruption_at if interrupt else sp.max_new_tokens
        layout = self.config.routes
        first = parse_generate_response(
            await client.generate(
                input_ids=req.prompt_ids,
                sampling_params=sglang_sampling_params(sp, seed=req.seed, max_new_tokens=think_budget),
                rid=req.rid, return_routed_experts=layout is not None, lora_path=lora,
            ),
            initial_version=init, routes=layout, input_len=len(req.prompt_ids),
        )
        routed = first.routed
        ids, lps, vers = first.output_ids, first.logprobs, first.versions
        mask = [1] * len(ids)
        reason = finish_reason(first.finish_type)
        interrupted_at = None
        if interrupt and reason == FinishReason.LENGTH and len(ids) >= think_budget:
            interrupted_at = len(ids)
            phrase = list(sp.interruption_ids)
            v = vers[-1] if vers else init
            ids, lps, vers, mask = ids + phrase, lps + [0.0] * len(phrase), vers + [v] * len(phrase), mask + [0] * len(phrase)
            reason = FinishReason.LENGTH  # no answer budget: truncated (types.FinishReason)
            if sp.answer_budget > 0:
                second = parse_generate_response(
                    await client.generate(
                        input_ids=req.prompt_ids + ids,
                        sampling_params=sglang_sampling_params(sp, seed=req.seed, max_new_tokens=sp.answer_budget),
                        rid=req.rid + "/answer", return_routed_experts=layout is not None, lora_path=lora,
                    ),
                    initial_version=init, routes=layout, input_len=len(req.prompt_ids) + len(ids),
                )
                if layout is not None:  # positions the first request covered keep its routes
                    import numpy as np

                    routed = np.concatenate([routed, second.routed[len(routed):]])
                ids, lps = ids + second.output_ids, lps + second.logprobs
                vers, mask = vers + second.versions, mask + [1] * len(second.output_ids)
                answer_end = finish_reason(second.finish_type)
                reason = FinishReason.INTERRUPTED if answer_end == FinishReason.STOP else answer_end
        return Completion(
            prompt_id=req.prompt_id,
            sample_index=req.sample_index,
            prompt_ids=list(req.prompt_ids),
            output_ids=ids,
            gen_logprobs=lps,
            weight_versions=vers,
            finish_reason=reason,
            loss_mask=mask,
            interrupted_at=interrupted_at,
            submitted_version=req.submitted_version,
            timings={"generate_s": time.monotonic() - t0},
            routes=None if layout is None else completion_routes(routed, layout, prompt_len=len(req.prompt_ids),
                                                                 versions=vers, initial=init),
        )


def _ensure_open_files(needed: int, *, what: str) -> None:
    """Raise this process's soft RLIMIT_NOFILE to `needed` (up to the hard limit): every request in
    flight holds a socket, and 1024 (a common soft default) is below a fleet's concurrency. ValueError
    naming `what` if the hard limit is lower."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ValueError(f"{what} need about {needed} open files, above this process's hard limit "
                         f"RLIMIT_NOFILE={hard} (`ulimit -Hn`): lower rollout.max_batch_size or raise the limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
