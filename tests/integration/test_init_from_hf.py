"""`init_from_hf`: a fresh run's Megatron policy starts from a Hugging Face checkpoint.

Independent oracle: the HF `transformers` model loaded from the same directory. After loading, the
trainer's FP32 log-probs of random sequences must equal HF's (float64 log_softmax of its logits).
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest


def random_sft_batch(vocab_size: int):
    """(ids [3, 17] of seed 0, the SftBatch scoring tokens 1..16 of each row)."""
    import torch

    from scalerl_mega.types import SftBatch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (3, 17), generator=g)
    return ids, SftBatch(input_ids_BT=ids[:, :-1], position_ids_BT=torch.arange(16).expand(3, 16).contiguous(),
                         targets_BT=ids[:, 1:], loss_mask_BT=torch.ones(3, 16))


def worker(hf_dir: str, out: str) -> None:
    import torch

    from scalerl_mega.build import init_trainer_from_hf
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

    torch.set_num_threads(1)
    model = load_model_preset("tiny_moe")
    trainer = MegatronPolicyTrainer(MegatronConfig(model=model, parallel=ParallelConfig(), optim=OptimConfig(lr=1e-3)))
    try:
        ids, batch = random_sft_batch(model.vocab_size)
        before = trainer.logprobs(batch)
        loaded = init_trainer_from_hf(trainer, SimpleNamespace(init_from_hf=hf_dir, model=model))
        after = trainer.logprobs(batch)
        bad = None
        try:
            init_trainer_from_hf(trainer, SimpleNamespace(init_from_hf=hf_dir + "/nope", model=model))
        except ValueError as e:
            bad = str(e)
        import dataclasses

        mismatch = None
        try:
            deeper = dataclasses.replace(model, num_layers=model.num_layers + 2)
            init_trainer_from_hf(trainer, SimpleNamespace(init_from_hf=hf_dir, model=deeper))
        except ValueError as e:
            mismatch = str(e)
        with open(out, "w") as f:
            json.dump({"ids": ids.tolist(), "before": before.tolist(), "after": after.tolist(),
                       "n_loaded": len(loaded), "bad": bad, "mismatch": mismatch}, f)
    finally:
        trainer.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["causal", pytest.param("conditional", marks=pytest.mark.slow)])
def test_policy_initialised_from_hf_checkpoint_matches_transformers(tmp_path, layout):
    """causal: a Llama4ForCausalLM checkpoint; conditional: Meta's multimodal layout
    (Llama4ForConditionalGeneration, text weights under `language_model.`, vision tower skipped)."""
    import torch
    from transformers import AutoModelForCausalLM

    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.model.config import load_model_preset

    arch, kw = hf_config_from_model(load_model_preset("tiny_moe"))
    assert arch == "llama4"
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    torch.manual_seed(123)
    if layout == "conditional":
        from transformers import Llama4Config, Llama4ForConditionalGeneration

        from scalerl_mega.convert.tiny import tiny_conditional_config

        vision = tiny_conditional_config().vision_config.to_dict()
        hf = Llama4ForConditionalGeneration(Llama4Config(text_config=Llama4TextConfig(**kw).to_dict(), vision_config=vision))
    else:
        hf = Llama4ForCausalLM(Llama4TextConfig(**kw))
    hf.eval()
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)

    out = tmp_path / "out.json"
    code = f"import sys; sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r}); import test_init_from_hf as t; t.worker({str(hf_dir)!r}, {str(out)!r})"
    proc = subprocess.run([sys.executable, "-c", f"if __name__ == '__main__':\n    {code}"], capture_output=True,
                          text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())

    ids = torch.tensor(res["ids"])
    ref_model = hf if layout == "conditional" else AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        logits = ref_model(ids[:, :-1]).logits.double()
    ref = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    after, before = torch.tensor(res["after"], dtype=torch.float64), torch.tensor(res["before"], dtype=torch.float64)
    assert (after - ref).abs().max() < 1e-5
    assert (before - ref).abs().max() > 1e-2  # random init differed: the load did the work
    assert res["n_loaded"] > 0
    assert res["bad"] is not None and "init_from_hf" in res["bad"] and "nope" in res["bad"]
    assert res["mismatch"] is not None and "num_layers=2" in res["mismatch"] and "4" in res["mismatch"]
