"""A checkpoint saved before the first optimizer step (e.g. every group of loop steps 1-3 was filtered as
zero-variance) is named by the loop's step, loads, restores the optimizer-step count (0) and training continues
exactly as without the save/load round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def worker(ckpt: str, out: str, roundtrip: bool = True) -> None:
    import torch

    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import SftBatch

    torch.set_num_threads(1)
    cfg = MegatronConfig(model=load_model_preset("tiny_dense"), parallel=ParallelConfig(), optim=OptimConfig(lr=1e-3))
    t = MegatronPolicyTrainer(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.model.vocab_size, (4, 13), generator=g)
    batch = SftBatch(input_ids_BT=ids[:, :-1], position_ids_BT=torch.arange(12).expand(4, 12).contiguous(),
                     targets_BT=ids[:, 1:], loss_mask_BT=torch.ones(4, 12))
    try:
        extra, trainer_step = {}, None
        if roundtrip:
            t.save(ckpt, step=3, extra_state={"marker": 7})  # loop step 3, no optimizer step taken yet
            t.step = 5  # clobbered: load must restore the saved optimizer-step count
            extra = t.load(ckpt)
            trainer_step = t.step
        losses = [t.sft_step(batch)["loss"] for _ in range(2)]
    finally:
        t.close()
    with open(out, "w") as f:
        json.dump({"losses": losses, "marker": extra.get("marker"), "trainer_step": trainer_step}, f)


def _run(tmp_path, name: str, ckpt: str, roundtrip: bool = True) -> dict:
    out = tmp_path / f"{name}.json"
    here = __file__.rsplit("/", 1)[0]
    code = (f"import sys; sys.path.insert(0, {here!r}); import test_megatron_fresh_checkpoint as t; "
            f"t.worker({ckpt!r}, {str(out)!r}, {roundtrip!r})")
    proc = subprocess.run([sys.executable, "-c", f"if __name__ == '__main__':\n    {code}"], capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.compat  # runs in the compatibility leg of .ci/run (make test-compat), not in make test: the default suite's 20-min budget
@pytest.mark.timeout(600)
def test_checkpoint_before_first_step_loads_and_training_continues(tmp_path):
    res = _run(tmp_path, "a", str(tmp_path / "ckpt"))
    assert res["marker"] == 7 and res["trainer_step"] == 0
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_00000003"
    assert json.loads((tmp_path / "ckpt" / "step_00000003" / "COMPLETE").read_text()) == {"step": 3}
    # the same run without the save/load round trip gives the same losses
    again = _run(tmp_path, "b", str(tmp_path / "unused"), roundtrip=False)
    assert res["losses"] == again["losses"]
    assert res["losses"][1] < res["losses"][0]
