"""Each trainer rank's part of a per-stage weight sync in the training loop (`rollout.weight_sync_senders=
per_stage`; who sends what: weight_sync/plan.py; the wire: weight_sync/multi.py; this rank's share: export_senders.py).

Every rank of the trainer job runs `RankSync.sync` in lock step (the controller's loop calls it through
`ranks.ControllerTrainer.sync_weights`, the followers on its "sync" command). The controller, which alone
talks to the engine, coordinates: on the first sync every sending rank opens its own group (it hosts the
group's store) and the controller joins the engine to all of them; on every sync the controller checks
the whole update against the engine's manifest and announces every group's buckets, the senders
broadcast their shares at once, and the controller waits until the engine applied the version (only
when every group finished). The `sync/*` metrics come from the senders' own stats.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from scalerl_mega.weight_sync.plan import Sender, SenderLayout

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.weight_sync.multi import MultiSyncEngine
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer


class RankSync:
    """One rank's sender state for the per-stage sync (collective to use: every rank calls `sync`)."""

    def __init__(self, trainer: MegatronPolicyTrainer, *, bucket_bytes: int, flattened: bool, backend: str, timeout_s: float,
                 base_name: str = "weight_update_group") -> None:
        pcfg = trainer.cfg.parallel
        self.trainer = trainer
        self.layout = SenderLayout(pp=int(pcfg.pp), ep=int(pcfg.ep), base_name=base_name)
        self.bucket_bytes = int(bucket_bytes)
        self.flattened = bool(flattened)
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self._group: Any = None
        self._me: Sender | None = None
        self._opened = False

    def _plan(self, dtype: str | None) -> dict[str, list]:
        from scalerl_mega.weight_sync.plan import plan_buckets
        from scalerl_mega.trainer.megatron.export_senders import sender_plan

        cfg = self.trainer.cfg
        return {g: plan_buckets(s, bucket_bytes=self.bucket_bytes)
                for g, s in sender_plan(cfg.model, self.layout, dtype=dtype, params_dtype=cfg.params_dtype).items()}

    def _open(self, plan: dict[str, list], engine: MultiSyncEngine | None) -> None:
        """First sync: every sender hosts its group; the controller joins the engine to all of them."""
        import torch.distributed as dist

        from scalerl_mega.weight_sync.multi import open_sender_group
        from scalerl_mega.trainer.megatron.export_senders import my_sender
        from scalerl_mega.weight_sync import free_port

        me = my_sender(self.layout)
        self._me = me if me is not None and me.group_name in plan else None  # an expert pool with nothing to send
        host = socket.gethostname()
        hosts: list = [None] * dist.get_world_size()
        # the controller also says how many ranks each group has (the sender and every engine rank)
        dist.all_gather_object(hosts, (host, group_world_size(engine)))
        # the engine runs beside the controller: a sender on the controller's host is reached on loopback
        address = "127.0.0.1" if host == hosts[0][0] else socket.getfqdn()
        url = f"tcp://{address}:{free_port()}" if self._me else None
        urls: list = [None] * dist.get_world_size()
        dist.all_gather_object(urls, (self._me.group_name, url) if self._me else None)
        if engine is not None:
            engine.join_groups(dict(u for u in urls if u))
        if self._me:
            self._group = open_sender_group(self._me.group_name, url, world_size=hosts[0][1], backend=self.backend,
                                            timeout_s=self.timeout_s)
        if engine is not None:
            engine.wait_groups()
        self._opened = True

    def sync(self, *, version: int, dtype: str | None, engine: MultiSyncEngine | None = None) -> dict[str, float] | None:
        """Send this rank's share of weight version `version`; `engine` on the controller only, which
        returns the step's `sync/*` metrics (None elsewhere)."""
        import torch.distributed as dist

        from scalerl_mega.convert.model_config import dims_from_model_config
        from scalerl_mega.weight_sync.multi import bucket_metas, send_buckets, sync_metrics
        from scalerl_mega.weight_sync.plan import receive_seqs
        from scalerl_mega.trainer.megatron.export_senders import ExportMemory, export_own

        t0 = time.monotonic()
        plan = self._plan(dtype)
        if not self._opened:
            self._open(plan, engine)
        seqs = receive_seqs(dims_from_model_config(self.trainer.cfg.model), self.layout, plan)
        metas = {g: bucket_metas(b, version=version, flattened=self.flattened, seqs=seqs[g]) for g, b in plan.items()}
        if engine is not None:  # the manifest check of the whole update, before anything is sent
            engine.check_plan(metas, version=version)
            engine.announce_groups(metas, version=version)
        dist.barrier()
        memory = ExportMemory()
        stream = export_own(self.trainer.chunks, self.trainer.cfg.model, self.layout, dtype=dtype, memory=memory)
        stats: dict[str, Any] = {"group": ""}
        if self._me:
            sent = send_buckets(self._group, stream, buckets=plan[self._me.group_name], group_name=self._me.group_name,
                                version=version, timeout_s=self.timeout_s, flattened=self.flattened)
            stats = {"group": self._me.group_name, "bytes": sent.bytes, "peak_bucket_bytes": sent.peak_bucket_bytes}
        else:
            for _ in stream:  # the gathers are collective
                pass
        stats["transient_bytes"] = memory.peak_bytes + stats.get("peak_bucket_bytes", 0)
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, stats)
        if engine is None:
            return None
        engine.finish_groups(metas, version=version)
        return sync_metrics(every, seconds=time.monotonic() - t0)


def group_world_size(engine: MultiSyncEngine | None) -> int:
    """Ranks of each sender's group: 1 (the sender) + the engine's receiving ranks (2 for one local engine)."""
    return int(engine.group_world_size) if engine is not None else 0
