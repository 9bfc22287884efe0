"""The tiny checkpoints the real SGLang server serves in `make test-sglang`, generated here (never downloaded).

`make_tiny_llama(dir)`: an FP32 `LlamaForCausalLM` (hidden 64, 2 layers, 2 heads of 32, 1 KV head,
vocab 1024) with a byte-level BPE tokenizer trained by `tokenizers` on generated text, saved as an HF
directory (config.json + safetensors + tokenizer.json). `tiny_llama_weights(seed)` gives other weights of
the same model (what a trainer pushes in an update). The LM head is scaled up so next-token
distributions are peaked: two weight versions then differ by whole nats per token, and a token computed
with the wrong weights cannot pass for the right ones. `make_tiny(arch, dir)` / `tiny_weights(arch, seed)`
do the same for the Qwen3 ones: `qwen3` (`Qwen3ForCausalLM`, tied embeddings, q/k norms, head_dim 32 over
hidden 64 with 4 heads), `qwen3_moe` (`Qwen3MoeForCausalLM`, 4 experts top-2 renormalised, every layer MoE).

    python -m tests.sglang_support.tiny_model OUT_DIR     # writes OUT_DIR/{llama,qwen3,qwen3_moe} (idempotent)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

VOCAB = 1024
LLAMA = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, max_position_embeddings=256, tie_word_embeddings=False,
    rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=None, pad_token_id=0,
)
QWEN3 = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=256, tie_word_embeddings=True, rms_norm_eps=1e-6,
    rope_theta=1000000.0, bos_token_id=1, eos_token_id=None, pad_token_id=0,
)
QWEN3_MOE = dict(QWEN3, tie_word_embeddings=False, num_hidden_layers=2, moe_intermediate_size=32, num_experts=4,
                 num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                 router_aux_loss_coef=0.001)  # every layer MoE: SGLang 0.5.23 serves no dense Qwen3-MoE layer
CONFIGS = {"llama": LLAMA, "qwen3": QWEN3, "qwen3_moe": QWEN3_MOE}
HEAD_SCALE = 8.0
ROUTER_SCALE = 20.0  # spreads the router logits: tokens take different experts, and versions different routes
STAMP = "scalerl-tiny.json"


def tiny_weights(arch: str, seed: int) -> Any:
    """The tiny `arch` model ("llama", "qwen3", "qwen3_moe") with the weights of `seed` (FP32, eval mode)."""
    import torch
    import transformers

    from scalerl_mega.model.archs import arch_of

    a = arch_of(arch)
    cfg = getattr(transformers, a.config_class)(**CONFIGS[arch], torch_dtype="float32")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = getattr(transformers, a.causal_lm)(cfg)
    with torch.no_grad():
        if cfg.tie_word_embeddings:  # scaling the shared embedding would make the input token dominate every
            model.model.norm.weight.mul_(HEAD_SCALE)  # prediction: scale the final norm (the head's input) instead
        else:
            model.get_output_embeddings().weight.mul_(HEAD_SCALE)
        for layer in model.model.layers:
            gate = getattr(getattr(layer, "mlp", None), "gate", None)
            if gate is not None and hasattr(gate, "top_k"):
                gate.weight.mul_(ROUTER_SCALE)
    return model.float().eval()


def tiny_llama_weights(seed: int) -> Any:
    """The tiny Llama with the weights of `seed` (FP32, eval mode)."""
    return tiny_weights("llama", seed)


def _corpus(n: int = 4000) -> list[str]:
    import random

    rng = random.Random(0)
    words = ["the", "model", "token", "weight", "update", "cache", "prefix", "server", "reward", "policy", "sum",
             "of", "and", "is", "to", "a", "in", "version", "learn", "step"]
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        out.append(f"{' '.join(rng.choices(words, k=rng.randint(3, 12)))} {a}+{b}={a + b}.")
    return out


def train_tokenizer(out: Path) -> None:
    """Byte-level BPE with VOCAB entries (ids 0..2 are <pad>, <s>, </s>), saved as an HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if tok.get_vocab_size() != VOCAB:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} entries, expected {VOCAB}")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
                            ).save_pretrained(out)


def make_tiny(arch: str, out: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny `arch` model (weights of `seed`) + tokenizer to `out`; skipped when `out` holds it already."""
    out = Path(out)
    stamp = {"config": CONFIGS[arch], "seed": seed, "head_scale": HEAD_SCALE}
    if arch != "llama":
        stamp["router_scale"] = ROUTER_SCALE
    if (out / STAMP).is_file() and json.loads((out / STAMP).read_text()) == stamp:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tiny_weights(arch, seed).save_pretrained(out)
    train_tokenizer(out)
    (out / STAMP).write_text(json.dumps(stamp))
    return out


def make_tiny_llama(out: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny Llama (weights of `seed`) + tokenizer to `out`; skipped when `out` holds it already."""
    return make_tiny("llama", out, seed=seed)


if __name__ == "__main__":
    for name in CONFIGS:
        print(make_tiny(name, Path(sys.argv[1]) / name))
