"""Multi-sender weight sync into SGLang servers (who sends what: weight_sync/plan.py, the wire: weight_sync/multi.py).

Every sender (a trainer rank) hosts its own named weight-update group; each server joins every group
(SGLang 0.5.23 keeps `init_weights_update_group`'s groups by `group_name`, and each
`update_weights_from_distributed` call names its group and carries any subset of the parameters). One
update, on every server:

  /pause_generation, /begin_weight_update   once, before any group's first bucket
  /update_weights_from_distributed          every group's buckets, one call at a time, in the update's one
                                            receiving order (`weight_sync.multi.receive_order`); one caller
                                            thread per server; `weight_version` left out
  /update_weight_version                    only when every group delivered every bucket
  /end_weight_update, /continue_generation  always, also after a failure

Why one order: a server serialises its control requests (its FIFO `FanOutCommunicator`; the scheduler
receives a broadcast inside the request), so it is inside one group's broadcast at a time, and a broadcast
completes only when every server of the group takes part. Two servers that took different groups first
would each wait for the other until the deadline. Every server here walks the same sequence, a function of
the plan alone, so they meet in each broadcast; the sequence follows the senders' export order
(`weight_sync.plan.receive_seqs`), so every sender can reach its next bucket. The groups' broadcasts into
SGLang therefore run one after another: the receiver, not the sender, bounds a per-stage update
(cluster/sync_model.py). Every call is bounded by the sync deadline times the update's buckets.

A failed bucket (a dead sender: its broadcast fails on every server) is named with its group, index and first
tensor, every server skips that group from there on and the other groups go on; the version is then not
advanced (SGLang applies each bucket as it arrives: buckets already received stay applied, as with a
rejected single-sender bucket; the manifest check before the first byte is what keeps a wrong update out).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol
from urllib.parse import urlparse

from scalerl_mega.weight_sync import BucketMeta, WeightManifest, WeightSyncError
from scalerl_mega.weight_sync.multi import receive_order


def _address(init_method: str, *, group: str) -> tuple[str, int]:
    """(host, port) of a sender's `tcp://host:port` rendezvous."""
    u = urlparse(init_method)
    if u.scheme != "tcp" or not u.hostname or not u.port:
        raise ValueError(f"weight sync group {group!r}: init method {init_method!r} is not tcp://host:port")
    return u.hostname, u.port


class GroupsHost(Protocol):
    """What the multi-sender receive uses of its engine (`engine.SGLangRolloutEngine`): its servers, their
    control clients, settings, fan-out and version state."""

    servers: list[Any]
    _ctl_clients: list[Any]
    config: Any
    version: int
    _stale: Any
    _in_place_checked: bool

    def manifest(self) -> WeightManifest | None: ...

    def _check_in_place_flags(self) -> None: ...

    def _fan_out(self, fn: Callable[[Any], Any], *, what: str, timeout_s: float) -> list: ...


class SGLangGroups:
    """The multi-sender side of an `SGLangRolloutEngine` (`weight_sync.multi.MultiSyncEngine`); the engine delegates."""

    def __init__(self, engine: GroupsHost) -> None:
        self.engine = engine
        self.joined: list[str] = []
        self._pending: list[tuple[list, Future]] = []
        self._running: list[Future] = []
        self._pool: ThreadPoolExecutor | None = None

    @property
    def world_size(self) -> int:
        """Ranks of every sender's group: the sender and every server's TP ranks."""
        from scalerl_mega.weight_sync import engine_rank_offsets

        return engine_rank_offsets([s.tp_size for s in self.engine.servers])[0]

    def _executor(self, workers: int) -> ThreadPoolExecutor:
        if self._pool is None or self._pool._max_workers < workers:  # noqa: SLF001 - grow only
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sglang-groups")
        return self._pool

    def join(self, init_methods: dict[str, str]) -> None:
        """Start every server joining every group (no wait; `wait_joined` waits): one caller thread per server,
        the groups in one order all servers share (by name). Joining a group is collective over its ranks and a
        server joins one group at a time, so servers that joined in different orders would wait on each other."""
        from scalerl_mega.weight_sync import engine_rank_offsets

        eng = self.engine
        world_size, offsets = engine_rank_offsets([s.tp_size for s in eng.servers])
        groups = [(name, *_address(url, group=name)) for name, url in sorted(init_methods.items())]
        pool = self._executor(len(eng.servers) + 1)
        self._pending = [(groups, pool.submit(self._join, client, groups, rank_offset=off, world_size=world_size))
                         for client, off in zip(eng._ctl_clients, offsets)]  # noqa: SLF001 - the engine's own clients

    def _join(self, client, groups: list[tuple[str, str, int]], *, rank_offset: int, world_size: int) -> None:
        """One server joins `groups` in order; WeightSyncError naming the group it could not join."""
        from scalerl_mega.rollout.sglang.client import SGLangError

        for name, host, port in groups:
            try:
                client.init_weights_update_group(master_address=host, master_port=port, rank_offset=rank_offset,
                                                 world_size=world_size, group_name=name,
                                                 backend=self.engine.config.sync.backend)
            except SGLangError as e:
                raise WeightSyncError(f"weight sync group {name!r}: a server could not join: {e}") from e

    def wait_joined(self) -> None:
        """Every server joined every group, or WeightSyncError."""
        pending, self._pending = self._pending, []
        groups = sum(len(g) for g, _ in pending)
        deadline = time.monotonic() + self.engine.config.sync.timeout_s * (groups + 1)
        for names, fut in pending:
            try:
                fut.result(timeout=max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                raise WeightSyncError(f"weight sync groups {[n for n, _, _ in names]}: a server did not join within "
                                      "the deadline") from None
        for names, _ in pending:
            self.joined += [n for n, _, _ in names if n not in self.joined]

    def check(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        """The manifest check of the whole update before the first byte (WeightSyncError naming the tensor)."""
        from scalerl_mega.weight_sync.multi import plan_specs

        manifest = self.engine.manifest()
        if manifest is not None:
            manifest.check(plan_specs(plan), version=version)

    def announce(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        """Pause and open the servers' update session, then start receiving every group's buckets."""
        eng = self.engine
        missing = [g for g in plan if g not in self.joined]
        if missing:
            raise WeightSyncError(f"weight update v{version}: the servers never joined group(s) {missing}")
        mode = eng.config.pause_mode
        if mode == "in_place" and not eng._in_place_checked:  # noqa: SLF001
            eng._check_in_place_flags()  # noqa: SLF001
        t = eng.config.control_timeout_s
        eng._fan_out(lambda c: c.pause_generation(mode), what=f"pause_generation({mode})", timeout_s=t)  # noqa: SLF001
        try:
            eng._fan_out(lambda c: c.begin_weight_update(), what="begin_weight_update", timeout_s=t)  # noqa: SLF001
        except WeightSyncError:  # never leave the servers paused
            eng._fan_out(lambda c: c.continue_generation(), what="continue_generation", timeout_s=t)  # noqa: SLF001
            raise
        pool = self._executor(len(eng.servers) + 1)
        order = receive_order(plan)
        flush = mode != "in_place"
        self._running = [pool.submit(self._receive, c, order, flush) for c in eng._ctl_clients]  # noqa: SLF001

    @staticmethod
    def _receive(client, order: list[tuple[str, BucketMeta]], flush: bool) -> int:
        """One server's receive: every group's buckets in the update's one order. A failed bucket (a dead
        sender: its broadcast fails on every server) ends its group here, the other groups go on; raises
        naming every failed group, bucket and first tensor."""
        failed: dict[str, str] = {}
        for group, meta in order:
            if group in failed:
                continue
            try:
                client.update_weights_from_distributed(meta, group_name=group, flush_cache=flush, set_version=False)
            except Exception as e:  # noqa: BLE001 - re-raised naming the group, bucket and tensor
                failed[group] = (f"sender {group!r} bucket {meta.index} (first tensor {meta.names[0]!r}): "
                                 f"{type(e).__name__}: {e}")
        if failed:
            raise WeightSyncError("; ".join(failed.values()))
        return len(order)

    def finish(self, plan: dict[str, list[BucketMeta]], *, version: int) -> None:
        """Wait for every group (bounded), then apply the version on every server; WeightSyncError naming every
        failed sender, bucket and tensor (the version stays). The servers are resumed either way."""
        eng = self.engine
        running, self._running = self._running, []
        buckets = sum(len(m) for m in plan.values())
        deadline = time.monotonic() + eng.config.sync.timeout_s * (buckets + 1)
        failures: list[str] = []
        for server, fut in zip(eng.servers, running):
            try:
                fut.result(timeout=max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                failures.append(f"server {getattr(server, 'url', server)}: no reply within the deadline of {buckets} "
                                "buckets")
            except WeightSyncError as e:
                failures.append(str(e))
        t = eng.config.control_timeout_s
        try:
            if not failures:
                eng._fan_out(lambda c: c.update_weight_version(str(version)), what="update_weight_version",  # noqa: SLF001
                             timeout_s=t)
        finally:
            eng._fan_out(lambda c: c.end_weight_update(), what="end_weight_update", timeout_s=t)  # noqa: SLF001
            eng._fan_out(lambda c: c.continue_generation(), what="continue_generation", timeout_s=t)  # noqa: SLF001
        if failures:
            raise WeightSyncError(f"weight update v{version} failed, the servers keep version v{eng.version} "
                                  "(buckets already received stay loaded): " + "; ".join(dict.fromkeys(failures)))
        eng.version = version
        eng._stale.clear()  # noqa: SLF001

    def close(self) -> None:
        """Leave every group on every server (best effort: a server may already be gone)."""
        from scalerl_mega.rollout.sglang.client import SGLangError

        for name in self.joined:
            for client in self.engine._ctl_clients:  # noqa: SLF001
                try:
                    client.destroy_weights_update_group(name)
                except SGLangError:
                    pass  # the server is down or restarted: it holds no group
        self.joined = []
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
