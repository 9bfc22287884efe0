"""trainer/ranks.py: the controller -> follower command channel over a real 2-process gloo group."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.multiprocessing as mp

from scalerl_mega.trainer.ranks import ControlChannel, RankFailure, _join, _split, serve
from scalerl_mega.types import TrainBatch


def _batch(B=3, T=5) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    return TrainBatch(input_ids_BT=torch.randint(0, 50, (B, T), generator=g),
                      position_ids_BT=torch.arange(T).expand(B, T).clone(), loss_mask_BT=torch.rand(B, T, generator=g),
                      targets_BT=torch.randint(0, 50, (B, T), generator=g), gen_logp_BT=-torch.rand(B, T, generator=g),
                      advantages_B=torch.randn(B, generator=g), prompt_index_B=torch.tensor([0, 0, 1]),
                      token_weights_BT=torch.rand(B, T, generator=g).double(), weight_version_BT=torch.zeros(B, T, dtype=torch.long),
                      policy_version=7, micro_batches=[[0, 2], [1]], lengths_B=[5, 4, 3], prompt_ids=["a", "b"])


def _same(a: TrainBatch, b: TrainBatch) -> None:
    for name in ("input_ids_BT", "position_ids_BT", "loss_mask_BT", "targets_BT", "gen_logp_BT", "advantages_B",
                 "prompt_index_B", "token_weights_BT", "weight_version_BT"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert (a.policy_version, a.micro_batches, a.lengths_B, a.prompt_ids) == (
        b.policy_version, b.micro_batches, b.lengths_B, b.prompt_ids)


def test_split_join_round_trip_is_exact():
    b = _batch()
    tensors: list = []
    skeleton = _split({"batch": b, "k": (1, "x")}, tensors)
    assert len(tensors) == 9  # the pickled skeleton holds no tensor: each goes by its own broadcast
    assert not any(torch.is_tensor(getattr(skeleton["batch"], f.name)) for f in dataclasses.fields(TrainBatch))
    back = _join(skeleton, tensors)
    _same(b, back["batch"])
    assert back["k"] == (1, "x")


class _Recorder:
    def __init__(self):
        self.calls = []

    def train_step(self, batch):
        self.calls.append(("train_step", batch))

    def export_hf_weights(self, *, dtype=None):
        self.calls.append(("export", dtype))
        return iter([("w", torch.zeros(1))])

    def save(self, path, *, step=None, extra_state=None):
        self.calls.append(("save", path, step, extra_state))

    def load(self, path):
        self.calls.append(("load", path))
        return {}


class _SyncRecorder:
    """Stands in for `sync_senders.RankSync`: records each rank's sync call."""

    def __init__(self, calls):
        self.calls = calls

    def sync(self, *, version, dtype, engine=None):
        self.calls.append(("sync", version, dtype, engine))
        return {"sync/senders": 2.0} if engine is not None else None


def _worker(rank: int, port: int, q, done, mode: str):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        ch = ControlChannel(timeout_s=60 if mode == "serve" else 2)
        if mode == "serve":
            if ch.is_controller:
                b = _batch()
                ch.send("train_step", b)
                ch.send("export", "bfloat16")
                ch.send("sync", (7, "float32"))
                ch.send("save", ("/ckpt", 12))
                ch.send("load", "/ckpt")
                ch.send("stop")
                q.put(("controller", ch.share("resume?")))
            else:
                rec = _Recorder()
                steps = serve(rec, ch, sync=_SyncRecorder(rec.calls))
                _same(_batch(), rec.calls[0][1])
                q.put(("follower", steps, [c[0] for c in rec.calls], rec.calls[1][1], rec.calls[3][1:],
                       ch.share(None), rec.calls[2][1:]))
        else:  # the controller never sends: the follower gives up after its timeout, naming the key
            if ch.is_controller:
                q.put(("controller", "idle"))
                done.wait(120)  # stay up (sending nothing) until the follower has timed out
            else:
                try:
                    ch.recv()
                    q.put(("follower", "no error"))
                except RankFailure as exc:
                    q.put(("follower", str(exc)))
                finally:
                    done.set()
    finally:
        dist.destroy_process_group()


def _run(mode: str) -> dict:
    from scalerl_mega.trainer.megatron.parallel import free_port

    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, q, done, mode)) for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    for _ in range(2):
        item = q.get(timeout=600)
        out[item[0]] = item[1:]
    for p in procs:
        p.join(timeout=600)
    return out


def test_follower_executes_commands_in_order():
    out = _run("serve")
    steps, calls, dtype, save_args, shared, sync_args = out["follower"]
    assert steps == 1 and calls == ["train_step", "export", "sync", "save", "load"]
    assert sync_args == (7, "float32", None)  # a follower sends its share; only the controller has the engine
    assert dtype == "bfloat16" and save_args == ("/ckpt", 12, None)  # the loop's extras stay on the controller
    assert shared == "resume?" and out["controller"] == ("resume?",)


def test_follower_without_commands_fails_naming_the_timeout():
    out = _run("timeout")
    msg = out["follower"][0]
    assert "train.follower_timeout_s=2" in msg and "controller (rank 0)" in msg


def test_unknown_command_refused():
    class _Ch(ControlChannel):
        def __init__(self):  # no process group needed to check the name
            self.rank, self.world_size = 0, 1

    with pytest.raises(ValueError, match="unknown trainer command 'train'"):
        _Ch().send("train")



def test_controller_trainer_declares_its_surface():
    """The proxy forwards only the PolicyTrainer calls (each broadcast first), nothing else by name:
    a collective such as `logprobs` on the controller alone would leave the followers waiting."""
    from scalerl_mega.interfaces import PolicyTrainer
    from scalerl_mega.trainer.ranks import ControllerTrainer

    class _Ch:
        rank, is_controller = 0, True

        def __init__(self):
            self.sent = []

        def send(self, command, payload=None):
            self.sent.append((command, payload))

    class _WithLogprobs(_Recorder):
        def logprobs(self, batch):
            return None

    ch, rec = _Ch(), _WithLogprobs()
    handle = ControllerTrainer(rec, ch)
    assert isinstance(handle, PolicyTrainer)
    with pytest.raises(AttributeError):
        handle.logprobs  # noqa: B018 - not part of the declared surface
    handle.train_step("b")
    handle.save("/ckpt", step=4, extra_state={"loop": 1})
    assert ch.sent == [("train_step", "b"), ("save", ("/ckpt", 4))]  # the loop's extras stay on the controller
    assert rec.calls == [("train_step", "b"), ("save", "/ckpt", 4, {"loop": 1})]


def test_controller_trainer_sync_weights_broadcasts_then_sends_its_own_share():
    """`sync_weights` (rollout.weight_sync_senders=per_stage) tells the followers first, then runs the
    controller's own share with the engine and returns its sync/* metrics; without a RankSync it is refused."""
    from scalerl_mega.trainer.ranks import ControllerTrainer

    class _Ch:
        rank, is_controller = 0, True

        def __init__(self):
            self.sent = []

        def send(self, command, payload=None):
            self.sent.append((command, payload, list(rec.calls)))

    rec = _Recorder()
    ch = _Ch()
    handle = ControllerTrainer(rec, ch, sync=_SyncRecorder(rec.calls))
    assert handle.sync_weights("engine", version=3, dtype="bfloat16") == {"sync/senders": 2.0}
    assert ch.sent == [("sync", (3, "bfloat16"), [])]  # broadcast before the controller's own share
    assert rec.calls == [("sync", 3, "bfloat16", "engine")]
    with pytest.raises(ValueError, match="rollout.weight_sync_senders=per_stage"):
        ControllerTrainer(rec, ch).sync_weights("engine", version=4)
