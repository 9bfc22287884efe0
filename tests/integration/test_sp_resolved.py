"""MoE + TP with `parallel.sequence_parallel` unset: sequence parallelism is resolved on (Megatron-Core
requires it for MoE with tp > 1, `ParallelConfig.sequence_parallel_on`), and the training step must
cut micro-batches to widths divisible by TP from that resolved value, not from the raw flag (None):
a width of 31 at TP2 fails in Megatron's sequence-parallel scatter. Two gloo ranks on CPU; the run
with the flag unset must equal the run with `sequence_parallel=true` spelled out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ODD_T = 31  # not a multiple of tp=2


def _worker(out: Path) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parents[1]))
    from megatron_worker import Run

    from scalerl_mega.trainer.megatron import parallel as par
    from scalerl_mega.model.config import ParallelConfig

    torch.set_num_threads(1)
    res: dict = {}
    for name, flag in (("unset", None), ("explicit", True)):
        parallel = ParallelConfig(tp=2, sequence_parallel=flag)
        run = Run("tiny_moe", parallel, False, None)
        g = torch.Generator().manual_seed(7)
        ids = torch.randint(0, run.cfg.model.vocab_size, (4, ODD_T), generator=g)
        mask = torch.ones(4, ODD_T)
        mask[:, -1] = 0.0
        run.batch = {"input_ids": ids, "position_ids": torch.arange(ODD_T).expand(4, ODD_T).contiguous(),
                     "targets": torch.roll(ids, -1, dims=1) * (mask > 0), "loss_mask": mask}
        res[name] = {"flag": flag, "resolved": parallel.sequence_parallel_on(run.cfg.model),
                     "model_sp": bool(run.tcfg.sequence_parallel), **run.train(2)}
        par.teardown_parallel(destroy_process_group=False)
    if dist.get_rank() == 0:
        (out / "sp.json").write_text(json.dumps(res))
    dist.destroy_process_group()


@pytest.mark.timeout(600)
def test_moe_tp2_with_sequence_parallel_unset_trains_like_explicit(tmp_path):
    import mp_launch

    procs = mp_launch.start(Path(__file__), 2, ["--worker", str(tmp_path)], logdir=tmp_path, log_name="sp")
    mp_launch.wait(procs, logdir=tmp_path, log_name="sp", what="sp_resolved", timeout=500)
    res = json.loads((tmp_path / "sp.json").read_text())
    assert res["unset"]["flag"] is None and res["unset"]["resolved"] is True and res["unset"]["model_sp"] is True
    assert res["unset"]["loss"] == res["explicit"]["loss"]
    assert res["unset"]["grad_norm"] == res["explicit"]["grad_norm"]
    assert res["unset"]["loss"][1] < res["unset"]["loss"][0]


if __name__ == "__main__":
    _worker(Path(sys.argv[sys.argv.index("--worker") + 1]))
