"""Rank worker for test_real_model.py: load an HF checkpoint into the Megatron trainer at the TP of
the launch (model=hf path: the ModelConfig comes from config.json) and write rank 0's log-probs.

    python real_model_worker.py HF_DIR IDS_JSON OUT_JSON   (WORLD_SIZE ranks, TP = WORLD_SIZE)
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace


def main(hf_dir: str, ids_json: str, out: str) -> None:
    import torch

    from scalerl_mega.build import init_trainer_from_hf
    from scalerl_mega.model.hf_import import model_from_hf_dir
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.types import SftBatch

    torch.set_num_threads(1)
    tp = int(os.environ.get("WORLD_SIZE", "1"))
    model = model_from_hf_dir(hf_dir)
    trainer = MegatronPolicyTrainer(MegatronConfig(model=model, parallel=ParallelConfig(tp=tp), optim=OptimConfig()))
    try:
        ids = torch.tensor(json.loads(open(ids_json).read()))
        n, t = ids.shape[0], ids.shape[1] - 1
        batch = SftBatch(input_ids_BT=ids[:, :-1].contiguous(), position_ids_BT=torch.arange(t).expand(n, t).contiguous(),
                         targets_BT=ids[:, 1:].contiguous(), loss_mask_BT=torch.ones(n, t))
        init_trainer_from_hf(trainer, SimpleNamespace(init_from_hf=hf_dir, model=model))
        lp = trainer.logprobs(batch)
        if int(os.environ.get("RANK", "0")) == 0:
            with open(out, "w") as f:
                json.dump({"logprobs": lp.tolist(), "tp": tp}, f)
    finally:
        trainer.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
