"""HF transformers + PEFT log-probs of a trainer's base model with its exported LoRA adapter (not a test module):
the base exported as HF weights into the architecture's transformers class, the adapter written as a PEFT
directory and loaded with `peft.PeftModel.from_pretrained`, FP32."""

from __future__ import annotations

from pathlib import Path


def hf_base_model(trainer):
    """The trainer's (frozen) base as the transformers causal LM, FP32, eval mode."""
    import torch

    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.local_spec import LocalModelSpec, build_model

    arch, kwargs = hf_config_from_model(trainer.cfg.model)
    model = build_model(LocalModelSpec(arch=arch, config=kwargs, dtype="float32"))
    weights = {n: t.float() for n, t in trainer.export_hf_weights()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    allowed = {"lm_head.weight"} if trainer.cfg.model.tie_embeddings else set()
    assert set(missing) <= allowed and not unexpected, (missing, unexpected)
    return model.to(torch.float32).eval()


def hf_peft_logprobs(trainer, adapter_config: dict, named: list, batch, *, workdir: Path):
    """[B, T] log-probs of `batch.targets_BT` under HF + PEFT with the adapter (same positions as the trainer's)."""
    import torch
    from peft import PeftModel

    from scalerl_mega.model.peft_files import write_peft_adapter

    adapter_dir = write_peft_adapter(Path(workdir) / "peft_adapter", adapter_config, named)
    model = PeftModel.from_pretrained(hf_base_model(trainer), str(adapter_dir)).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids_BT, position_ids=batch.position_ids_BT).logits.float()
    return torch.log_softmax(logits, -1).gather(-1, batch.targets_BT.unsqueeze(-1)).squeeze(-1)
