"""Engine-vs-trainer log-prob agreement helpers shared by tests/integration/test_rollout_onpolicy.py (the local
engine) and tests/sglang_support/onpolicy_worker.py (a real SGLang server): the engine's completions as a
right-padded batch, the Megatron trainer's FP32 log-probs of it, and their largest difference."""

from __future__ import annotations


def completion_batch(completions):
    """Right-padded [B, T] rows of prompt + output; targets are the next tokens; the loss mask covers the outputs."""
    import torch

    from scalerl_mega.types import SftBatch

    seqs = [c.prompt_ids + c.output_ids for c in completions]
    T, B = max(len(s) for s in seqs), len(seqs)
    ids = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    for b, (c, s) in enumerate(zip(completions, seqs)):
        ids[b, : len(s)] = torch.tensor(s)
        p = len(c.prompt_ids)
        mask[b, p - 1: p - 1 + len(c.output_ids)] = 1.0
    targets = torch.zeros_like(ids)
    targets[:, :-1] = ids[:, 1:]
    return SftBatch(input_ids_BT=ids, position_ids_BT=torch.arange(T).unsqueeze(0).expand(B, T).contiguous(),
                    targets_BT=targets, loss_mask_BT=mask)


def trainer_logprobs(chunks, batch):
    """FP32 log p(target) [B, T] from the trainer's Megatron GPTModel forward (TP1: full-vocab logits)."""
    import torch

    from scalerl_mega.trainer.megatron.global_names import unwrap

    (gpt,) = unwrap(chunks)
    gpt.eval()
    with torch.no_grad():
        logits = gpt(batch.input_ids_BT, batch.position_ids_BT, None)
    gpt.train()
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, batch.targets_BT[..., None])[..., 0]


def max_logprob_diff(logp_BT, completions) -> float:
    """Largest |trainer - engine| log-prob over every generated token."""
    worst = 0.0
    for b, c in enumerate(completions):
        p = len(c.prompt_ids)
        for j, lp in enumerate(c.gen_logprobs):
            worst = max(worst, abs(float(logp_BT[b, p - 1 + j]) - lp))
    return worst
