"""A tiny character-level tokenizer for the synthetic arithmetic task, as a real Hugging Face
tokenizer (`tokenizers` -> `transformers.PreTrainedTokenizerFast`): it saves with `save_pretrained`
and loads with `AutoTokenizer.from_pretrained(dir)`, so the engine and trainer use the HF path.

Vocabulary: <pad> <bos> <eos> <unk>, the single tokens `<think>`, `</think>`, `\\boxed{`, digits,
`+ = : } Q c` and space (the task), plus the characters of the paper's end-of-thinking phrase
"Okay, time is up. Let me stop thinking and formulate a final answer now. </think>" (Sec. 4), so
forced interruption uses the paper's phrase unchanged (47 tokens in all). Encoding prepends <bos>
(like Llama tokenizers); pass `add_special_tokens=False` for fragments such as the phrase.
"""

from __future__ import annotations

from typing import Any

INTERRUPTION_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
MULTI_CHAR = ["<think>", "</think>", "\\boxed{"]
TASK_CHARS = list("0123456789+=:} Qc")


PIECES = r"<think>|</think>|\\boxed\{|."
"""How the tokenizer splits text: the multi-character tokens first, then one token per character."""


def check_synthetic_vocab(*, vocab_size: int, interruption_phrase: str) -> None:
    """What building the synthetic task checks, without building the tokenizer (no transformers import): the
    model's vocabulary holds the task's tokens, and the interruption phrase has none outside them. ValueError
    naming the key."""
    import re

    vocab = arith_vocab()
    if len(vocab) > vocab_size:
        raise ValueError(f"model.vocab_size={vocab_size} is smaller than the synthetic task's vocabulary "
                         f"({len(vocab)} tokens)")
    unknown = sorted({p for p in re.findall(PIECES, interruption_phrase, flags=re.S) if p not in set(vocab)})
    if unknown:
        raise ValueError(f"length.interruption_phrase={interruption_phrase!r} has characters outside the task "
                         f"vocabulary: {unknown}")


def arith_vocab() -> list[str]:
    """Token strings in id order."""
    phrase_chars = sorted(set(INTERRUPTION_PHRASE.replace("</think>", "")) - set(TASK_CHARS))
    return [*SPECIAL, *MULTI_CHAR, *TASK_CHARS, *phrase_chars]


def build_arith_tokenizer() -> Any:
    """The task's `PreTrainedTokenizerFast` (pad/bos/eos/unk set; no chat template)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(arith_vocab())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # multi-character tokens first, then one token per character
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECES), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        model_max_length=512, padding_side="right",
    )
