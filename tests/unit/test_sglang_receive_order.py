"""Several SGLang servers receiving a multi-sender update (rollout/sglang/multi_groups.py): every server takes the
groups' buckets in one shared order, so two servers never sit in different groups' broadcasts waiting on each
other, and that order is one the senders can reach (weight_sync/plan.py `receive_seqs`).

The servers are a test double that keeps SGLang's rules: one control request at a time per server, and a bucket's
broadcast completes only when every server of the group is inside it. The double sees a deadlock the moment it
forms (a server blocked in one broadcast while another is blocked in a different one), so no test waits on time;
interleavings are forced with events."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from scalerl_mega.rollout.sglang.multi_groups import SGLangGroups
from scalerl_mega.weight_sync import BucketMeta, WeightSyncError
from scalerl_mega.weight_sync.multi import bucket_metas, receive_order
from scalerl_mega.weight_sync.plan import SenderLayout, plan_buckets, receive_seqs, sender_specs

SAFETY_S = 120.0  # a generous net only: the double detects a deadlock when it forms


class Deadlock(RuntimeError):
    pass


@dataclass
class Broadcasts:
    """Every group's broadcasts: (group, bucket) completes when all `servers` are inside it."""

    servers: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    inside: dict[int, tuple[str, int]] = field(default_factory=dict)
    arrived: dict[tuple[str, int], int] = field(default_factory=dict)
    done: set = field(default_factory=set)
    deadlock: str | None = None
    on_blocked: dict[int, threading.Event] = field(default_factory=dict)

    def receive(self, server: int, key: tuple[str, int]) -> None:
        with self.cond:
            if self.deadlock is not None:
                raise Deadlock(self.deadlock)
            other = {s: k for s, k in self.inside.items() if k != key and s != server}
            if other:
                self.deadlock = f"server {server} entered {key} while server(s) {other} wait in another broadcast"
                for ev in self.on_blocked.values():  # release every forced wait: the run is over
                    ev.set()
                self.cond.notify_all()
                raise Deadlock(self.deadlock)
            self.inside[server] = key
            self.arrived[key] = self.arrived.get(key, 0) + 1
            if self.arrived[key] == self.servers:
                self.done.add(key)
                self.inside = {s: k for s, k in self.inside.items() if k != key}
                self.cond.notify_all()
                return
            if server in self.on_blocked:
                self.on_blocked[server].set()
            self.cond.wait_for(lambda: key in self.done or self.deadlock is not None, timeout=SAFETY_S)
            if key not in self.done:
                raise Deadlock(self.deadlock or "safety net")


class FakeServer:
    """One SGLang server's control endpoint: one request at a time (a lock), every call logged."""

    def __init__(self, index: int, wire: Broadcasts, *, before: dict | None = None) -> None:
        self.index, self.wire = index, wire
        self.url = f"http://server{index}"
        self.tp_size = 1
        self.busy = threading.Lock()
        self.log: list = []
        self.before = before or {}  # (group, bucket) -> event to wait for before taking that request

    def update_weights_from_distributed(self, meta: BucketMeta, *, group_name: str, flush_cache: bool,
                                        set_version: bool) -> None:
        key = (group_name, meta.index)
        if key in self.before:
            assert self.before[key].wait(SAFETY_S)
        with self.busy:  # SGLang serialises its control requests
            self.log.append(key)
            self.wire.receive(self.index, key)

    def init_weights_update_group(self, *, group_name: str, **_) -> None:
        with self.busy:  # joining is collective over the group's ranks too
            self.log.append(("join", group_name))
            self.wire.receive(self.index, ("join", group_name))

    def __getattr__(self, name):  # pause, begin/end update, version, continue: logged
        return lambda *a, **k: self.log.append(name)


def host(servers: list[FakeServer]) -> SimpleNamespace:
    """The engine side `SGLangGroups` drives (`multi_groups.GroupsHost`)."""
    cfg = SimpleNamespace(pause_mode="in_place", control_timeout_s=5.0, sync=SimpleNamespace(timeout_s=SAFETY_S, backend="gloo"))

    def fan_out(fn, *, what, timeout_s):
        return [fn(c) for c in servers]

    return SimpleNamespace(servers=servers, _ctl_clients=servers, config=cfg, version=0, _stale=set(),
                           _in_place_checked=True, manifest=lambda: None, _fan_out=fan_out)


def plan_of(buckets_per_group: dict[str, int]) -> dict[str, list[BucketMeta]]:
    return {g: [BucketMeta(names=[f"{g}.w{i}"], dtypes=["float32"], shapes=[[1]], version=1, index=i, seq=i)
                for i in range(n)] for g, n in buckets_per_group.items()}


def test_the_old_receive_one_thread_per_group_and_server_deadlocks_when_servers_take_different_groups_first():
    """The double catches the bug: server 0 takes group a first, server 1 group b first (forced by events)."""
    wire = Broadcasts(servers=2)
    a_on_0, b_on_1 = threading.Event(), threading.Event()
    servers = [FakeServer(0, wire, before={("b", 0): a_on_0}), FakeServer(1, wire, before={("a", 0): b_on_1})]
    wire.on_blocked = {0: a_on_0, 1: b_on_1}
    errors: list = []

    def one_group(server, group):
        try:
            server.update_weights_from_distributed(plan_of({group: 1})[group][0], group_name=group, flush_cache=False,
                                                   set_version=False)
        except Deadlock as e:
            errors.append(e)

    threads = [threading.Thread(target=one_group, args=(s, g)) for s in servers for g in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wire.deadlock is not None and "wait in another broadcast" in wire.deadlock
    assert errors


@pytest.mark.parametrize("ahead", [0, 1])
def test_every_server_takes_the_shared_order_whichever_server_runs_ahead(ahead):
    """The real receive (`SGLangGroups`): one server is forced to be inside the first broadcast before the other
    takes any request; both walk the same sequence and the update completes (version applied)."""
    wire = Broadcasts(servers=2)
    plan = plan_of({"g-b": 3, "g-a": 2, "g-c": 1})
    first = receive_order(plan)[0]
    behind = 1 - ahead
    ahead_blocked = threading.Event()
    wire.on_blocked = {ahead: ahead_blocked}
    servers = [FakeServer(i, wire) for i in range(2)]
    servers[behind].before = {(first[0], first[1].index): ahead_blocked}
    eng = host(servers)
    groups = SGLangGroups(eng)
    groups.joined = list(plan)
    groups.announce(plan, version=1)
    groups.finish(plan, version=1)
    want = [(g, m.index) for g, m in receive_order(plan)]
    assert want == [("g-a", 0), ("g-b", 0), ("g-c", 0), ("g-a", 1), ("g-b", 1), ("g-b", 2)]  # by seq, then name
    for s in servers:
        assert [e for e in s.log if isinstance(e, tuple)] == want
        assert s.log[-3:] == ["update_weight_version", "end_weight_update", "continue_generation"]
    assert wire.deadlock is None and eng.version == 1


def test_a_failed_group_is_skipped_by_every_server_and_the_others_complete():
    wire = Broadcasts(servers=2)
    plan = plan_of({"a": 3, "b": 3})

    class DeadSender(FakeServer):
        def update_weights_from_distributed(self, meta, *, group_name, flush_cache, set_version):
            if (group_name, meta.index) == ("b", 1):  # the sender of b died: its broadcast fails on every server
                self.log.append((group_name, meta.index))
                raise ConnectionError("connection closed by peer")
            super().update_weights_from_distributed(meta, group_name=group_name, flush_cache=flush_cache,
                                                    set_version=set_version)

    servers = [DeadSender(i, wire) for i in range(2)]
    eng = host(servers)
    groups = SGLangGroups(eng)
    groups.joined = list(plan)
    groups.announce(plan, version=1)
    with pytest.raises(WeightSyncError) as err:
        groups.finish(plan, version=1)
    msg = str(err.value)
    assert msg.count("sender 'b' bucket 1 (first tensor 'b.w1')") == 1 and "keep version v0" in msg, msg
    for s in servers:
        assert [e for e in s.log if isinstance(e, tuple)] == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2)]
        assert "update_weight_version" not in s.log and s.log[-2:] == ["end_weight_update", "continue_generation"]
    assert eng.version == 0


def _dims():
    from scalerl_mega.convert.dims import dims_from_hf_config
    from scalerl_mega.convert.tiny import tiny_hf_config

    return dims_from_hf_config(tiny_hf_config("qwen3_moe").to_dict())


def reachable(order: list[tuple[str, int]], last_pos: dict[str, list[int]]) -> bool:
    """A serial receiver taking `order` against senders of one stage that share every gather (a collective of the
    stage's ranks per table group): a sender broadcasts bucket j after the gather of its last tensor (position
    `last_pos[g][j]`) and then waits for the receiver, so the stage's gathers stop at the lowest position any
    sender waits at. True when every bucket in `order` can be sent when the receiver asks for it."""
    nxt = {g: 0 for g in last_pos}
    for g, j in order:
        assert nxt[g] == j
        waiting = [last_pos[h][nxt[h]] for h in last_pos if nxt[h] < len(last_pos[h])]
        if last_pos[g][j] > min(waiting):  # another sender waits at an earlier gather: nobody moves
            return False
        nxt[g] += 1
    return True


def test_receive_seqs_follow_the_export_so_senders_sharing_gathers_reach_every_bucket():
    from scalerl_mega.convert import tables
    from scalerl_mega.weight_sync import TensorSpec

    dims = _dims()  # 4 layers, 4 experts; EP 2: the stage leader and the expert sender share the stage's gathers
    layout = SenderLayout(pp=1, ep=2)
    export = [TensorSpec(n, tables.expected_hf_shape(n, dims), "float32") for n in tables.hf_names(dims)]
    buckets = {g: plan_buckets(s, bucket_bytes=4096) for g, s in sender_specs(dims, layout, export).items()}
    seqs = receive_seqs(dims, layout, buckets)
    pos = {s.name: i for i, s in enumerate(export)}  # the tiny model's export order is the table order
    assert seqs == {g: [pos[b[-1].name] for b in bs] for g, bs in buckets.items()}
    metas = {g: bucket_metas(bs, version=1, flattened=False, seqs=seqs[g]) for g, bs in buckets.items()}
    assert all(len(m) > 2 for m in metas.values())
    ours = [(g, m.index) for g, m in receive_order(metas)]
    assert reachable(ours, seqs)
    group_after_group = [(g, j) for g in sorted(metas) for j in range(len(metas[g]))]
    assert not reachable(group_after_group, seqs)  # the stage leader's last bucket waits for the expert sender


def test_receive_order_refuses_buckets_out_of_order():
    plan = plan_of({"a": 2})
    plan["a"][1].seq = -1
    with pytest.raises(ValueError, match=r"group 'a'.s buckets are not in increasing receive order"):
        receive_order(plan)


def test_every_server_joins_the_groups_in_one_order():
    """Joining a group is collective too: every server joins the groups by name, one at a time, from one thread."""
    wire = Broadcasts(servers=2)
    servers = [FakeServer(i, wire) for i in range(2)]
    groups = SGLangGroups(host(servers))
    groups.join({"g-b": "tcp://127.0.0.1:2", "g-a": "tcp://127.0.0.1:1", "g-c": "tcp://127.0.0.1:3"})
    groups.wait_joined()
    for s in servers:
        assert s.log == [("join", "g-a"), ("join", "g-b"), ("join", "g-c")]
    assert wire.deadlock is None and sorted(groups.joined) == ["g-a", "g-b", "g-c"]
