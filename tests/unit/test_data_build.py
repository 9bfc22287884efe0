"""build_task for the dataset tasks (polaris / deepcoder / math_code) from local files: a generated
Polaris-format JSONL (and Deepcoder rows), a tiny byte-level BPE tokenizer saved to a temp dir.
Expected prompts, gold answers and split sizes are written out by hand from the generated rows."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from scalerl_mega.build import build_task
from scalerl_mega.data.sources import MATH_TEMPLATE

CHAT = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


def _tokenizer_dir(tmp_path, *, chat: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>", "<|user|>", "<|assistant|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["What is 1 + 2? Please reason step by step </think> \\boxed{}"] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    if chat:
        fast.chat_template = CHAT
    d = tmp_path / ("tok_chat" if chat else "tok_plain")
    fast.save_pretrained(d)
    return d, len(fast)


def _polaris_rows(n):
    return [{"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(n)]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(*, name="polaris", train_files, code_files=(), tokenizer_path, vocab_size=512, val_prompts=2,
         max_prompt_tokens=2048, use_chat_template=True, template=""):
    return SimpleNamespace(
        data=SimpleNamespace(name=name, train_files=list(train_files), code_files=list(code_files),
                             tokenizer_path=str(tokenizer_path), val_prompts=val_prompts, split_seed=0,
                             max_prompt_tokens=max_prompt_tokens, use_chat_template=use_chat_template,
                             template=template),
        model=SimpleNamespace(vocab_size=vocab_size), length=SimpleNamespace(interruption_phrase="</think>"))


def test_polaris_plain_template_prompts_gold_and_split(tmp_path):
    tok_dir, _ = _tokenizer_dir(tmp_path, chat=False)
    f = _write_jsonl(tmp_path / "polaris.jsonl", _polaris_rows(20))
    task = build_task(_cfg(train_files=[f], tokenizer_path=tok_dir))
    # 20 distinct prompts, 2 held out (<= 20% of 20 = 4)
    assert len(task.val_prompts) == 2 and len(task.train_prompts) == 18
    assert not {p.prompt_id for p in task.val_prompts} & {p.prompt_id for p in task.train_prompts}
    by_text = {p.text: p for p in task.train_prompts + task.val_prompts}
    want = MATH_TEMPLATE.format(problem="What is 3 + 4?")
    assert want.startswith("What is 3 + 4?\n\nPlease reason") and want in by_text
    p = by_text[want]
    assert p.gold == "7" and p.task == "math"
    assert p.token_ids == task.encode(want) and task.decode(p.token_ids) == want
    # the train set keeps file order
    assert [q.gold for q in task.train_prompts] == [q.gold for q in sorted(task.train_prompts, key=lambda q: int(q.gold))]
    assert task.stop_token_ids == [task.tokenizer.convert_tokens_to_ids("<eos>")]
    assert task.decode(task.interruption_ids) == "</think>"


def test_chat_template_and_prompt_length_filter(tmp_path):
    tok_dir, _ = _tokenizer_dir(tmp_path, chat=True)
    rows = _polaris_rows(10) + [{"problem": "What is " + " + ".join(["1"] * 200) + "?", "answer": "200"}]
    f = _write_jsonl(tmp_path / "p.jsonl", rows)
    task = build_task(_cfg(train_files=[f], tokenizer_path=tok_dir, max_prompt_tokens=64, template="Q: {problem}"))
    prompts = task.train_prompts + task.val_prompts
    assert len(prompts) == 10  # the 200-term problem is longer than 64 tokens
    assert "<|user|>Q: What is 0 + 1?<|assistant|>" in {p.text for p in prompts}
    assert all(len(p.token_ids) <= 64 for p in prompts)
    plain = build_task(_cfg(train_files=[f], tokenizer_path=tok_dir, max_prompt_tokens=64, use_chat_template=False))
    assert MATH_TEMPLATE.format(problem="What is 0 + 1?") in {p.text for p in plain.train_prompts + plain.val_prompts}


def test_math_code_mixes_both_sources(tmp_path):
    tok_dir, _ = _tokenizer_dir(tmp_path, chat=False)
    math_f = _write_jsonl(tmp_path / "m.jsonl", _polaris_rows(10))
    tests = json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}])
    code_f = _write_jsonl(tmp_path / "c.jsonl", [{"problem": f"Add two numbers, variant {i}.", "tests": tests}
                                                for i in range(5)])
    task = build_task(_cfg(name="math_code", train_files=[math_f], code_files=[code_f], tokenizer_path=tok_dir,
                           val_prompts=3))
    prompts = task.train_prompts + task.val_prompts
    assert len(task.val_prompts) == 3 and len(prompts) == 15
    assert sorted(p.task for p in prompts).count("code") == 5


def test_errors_name_the_key_or_file(tmp_path):
    tok_dir, n_vocab = _tokenizer_dir(tmp_path, chat=False)
    good = _write_jsonl(tmp_path / "good.jsonl", _polaris_rows(5))
    with pytest.raises(ValueError, match=r"data.name='polaris' needs a tokenizer \(data.tokenizer_path and init_from_hf "
                                         r"are empty\): a model of model.vocab_size=512 tokens cannot read free text"):
        build_task(_cfg(train_files=[good], tokenizer_path=""))
    with pytest.raises(ValueError, match="data.tokenizer_path='/nonexistent/tok'"):
        build_task(_cfg(train_files=[good], tokenizer_path="/nonexistent/tok"))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(ValueError, match="data.tokenizer_path=.*empty"):
        build_task(_cfg(train_files=[good], tokenizer_path=empty_dir))
    with pytest.raises(ValueError, match=f"model.vocab_size=16 .*{n_vocab} tokens"):
        build_task(_cfg(train_files=[good], tokenizer_path=tok_dir, vocab_size=16))
    with pytest.raises(ValueError, match="data.train_files is empty"):
        build_task(_cfg(train_files=[], tokenizer_path=tok_dir))
    with pytest.raises(ValueError, match="data.train_files: .*missing.jsonl.*no such file"):
        build_task(_cfg(train_files=[tmp_path / "missing.jsonl"], tokenizer_path=tok_dir))
    with pytest.raises(ValueError, match="data.code_files is empty"):
        build_task(_cfg(name="math_code", train_files=[good], tokenizer_path=tok_dir))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field 'answer'"):
        build_task(_cfg(train_files=[bad], tokenizer_path=tok_dir))
    with pytest.raises(ValueError, match="data.max_prompt_tokens=1"):
        build_task(_cfg(train_files=[good], tokenizer_path=tok_dir, max_prompt_tokens=1))
    with pytest.raises(ValueError, match="data.name='gsm8k'"):
        build_task(_cfg(name="gsm8k", train_files=[good], tokenizer_path=tok_dir))


def test_synthetic_prompts_are_held_to_max_prompt_tokens():
    """The synthetic task used to ignore data.max_prompt_tokens (every prompt longer than
    2 tokens still trained). Prompts over the limit are dropped; none fitting is refused when the task is
    built (`train.run_job` builds it first, before the trainer and any step), naming the key and the
    prompts' lengths. (Not at compose time: building the 20,000 demo prompts takes seconds.)"""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_hf_model_config import _compose

    from scalerl_mega.build import build_task
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer

    small = ("experiment=demo", "data.synthetic_num_prompts=1000", "data.val_prompts=100")  # seconds, not tens
    base = build_task(_compose(*small))
    tok = build_arith_tokenizer()
    lens = sorted(len(tok(p.text)["input_ids"]) for p in base.train_prompts)  # counted independently
    assert all(p.token_ids == tok(p.text)["input_ids"] for p in base.train_prompts[:20])
    limit = lens[len(lens) // 2]
    assert limit < lens[-1]  # some prompts are longer than the limit
    cut = build_task(_compose(*small, f"data.max_prompt_tokens={limit}"))
    assert len(cut.train_prompts) == sum(n <= limit for n in lens) < len(lens)
    assert max(len(p.token_ids) for p in cut.train_prompts) <= limit
    with pytest.raises(ValueError, match=rf"no prompt fits data\.max_prompt_tokens=2: the \d+ prompts are "
                                         rf"{lens[0]}-{lens[-1]} tokens \(data\.name=synthetic"):
        build_task(_compose(*small, "data.max_prompt_tokens=2"))
