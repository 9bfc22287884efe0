"""`scalerl-train --validate` performs every check the run performs before its first step (issue 49 item 2): each
config below passed `--validate` ("config OK") and was refused seconds into the run with a traceback. Now
composing it (what `--validate` and the run's start both do, compose.py) raises the ValueError that becomes the
one-line `config error:`; and an error only the run's set-up can find is that same line with exit status 2.
Own data with the embedded demo model says it cannot read free text and what to set (item 9)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _compose(*overrides: str):
    from scalerl_mega.compose import compose

    return compose(["experiment=demo", *overrides], machine=True)


def _rows(n: int) -> list[dict]:
    return [{"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(n)]


def _jsonl(path: Path, rows: list, *, raw_line: tuple[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    if raw_line is not None:
        lines.insert(raw_line[0] - 1, raw_line[1])
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def hf_model(tmp_path):
    """A dataset-capable setting: a real HF tokenizer (tests/unit/test_data_build.py's) and a model whose
    vocabulary holds it."""
    from test_data_build import _tokenizer_dir

    tok, n = _tokenizer_dir(tmp_path, chat=False)
    return [f"data.tokenizer_path={tok}", f"model.vocab_size={n + 8}", "data.max_prompt_tokens=64"]


def test_negative_learning_rate_is_refused_at_compose_time():
    with pytest.raises(ValueError, match=r"^optim.lr=-0.0001 must be > 0$"):
        _compose("optim.lr=-1e-4")


@pytest.mark.parametrize("raw, match", [
    ((3, '{"problem": "What is 1?", "answer": '), r"bad\.jsonl:3: bad JSON"),
    ((2, '{"problem": "no answer column"}'), r"bad\.jsonl:2: missing field 'answer'"),
])
def test_a_malformed_row_or_a_missing_column_is_refused_naming_file_and_line(tmp_path, hf_model, raw, match):
    f = _jsonl(tmp_path / "bad.jsonl", _rows(30), raw_line=raw)
    with pytest.raises(ValueError, match=rf"^data\.train_files: .*{match}"):
        _compose("data=jsonl", f"data.train_files=[{f}]", "data.val_prompts=5", *hf_model)


def test_val_prompts_must_leave_prompts_to_train_on(tmp_path, hf_model):
    f = _jsonl(tmp_path / "qa.jsonl", _rows(12) + _rows(12))  # 12 distinct prompts, each twice
    with pytest.raises(ValueError, match=r"data\.val_prompts=12 must be smaller than the dataset's 12 distinct"):
        _compose("data=jsonl", f"data.train_files=[{f}]", "data.val_prompts=12", *hf_model)
    with pytest.raises(ValueError, match=r"sft\.batch_size=64 exceeds the 10 SFT examples"):  # 12 - 2 held out
        _compose("data=jsonl", f"data.train_files=[{f}]", "data.val_prompts=5", *hf_model)
    c = _compose("data=jsonl", f"data.train_files=[{f}]", "data.val_prompts=5", "sft.batch_size=10", *hf_model)
    assert c.data.name == "jsonl"


def test_own_data_with_the_demo_model_says_it_cannot_read_free_text(tmp_path):
    f = _jsonl(tmp_path / "qa.jsonl", _rows(30))
    with pytest.raises(ValueError) as e:
        _compose("data=jsonl", f"data.train_files=[{f}]")
    msg = str(e.value)
    assert msg.startswith("data.name='jsonl' needs a tokenizer (data.tokenizer_path and init_from_hf are empty)")
    assert "a model of model.vocab_size=48 tokens cannot read free text (the embedded demo model's vocabulary is the " \
           "synthetic task's digits and symbols)" in msg
    assert "model=hf init_from_hf=/path/to/hf_checkpoint" in msg and "data.tokenizer_path=" in msg
    # a tokenizer alone is not enough: the demo model's 48-token vocabulary cannot hold it
    from test_data_build import _tokenizer_dir

    tok, n = _tokenizer_dir(tmp_path, chat=False)
    with pytest.raises(ValueError, match=rf"model.vocab_size=48 is smaller than the tokenizer's vocabulary \({n} "
                                         r"tokens, .*cannot read free text .*; use a pretrained model"):
        _compose("data=jsonl", f"data.train_files=[{f}]", f"data.tokenizer_path={tok}")


def test_synthetic_vocabulary_checks_need_no_tokenizer_build():
    with pytest.raises(ValueError, match=r"model.vocab_size=16 is smaller than the synthetic task's vocabulary"):
        _compose("model.vocab_size=16")
    with pytest.raises(ValueError, match=r"length.interruption_phrase='</think> ~' has characters outside"):
        _compose("length.interruption_phrase='</think> ~'")


def _cli(tmp_path, *args):
    return subprocess.run([sys.executable, "-c", "from scalerl_mega.train import main; main()", *args,
                           f"hydra.run.dir={tmp_path / 'hydra'}"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})


def test_validate_refuses_what_the_run_refuses_and_a_run_time_config_error_is_the_same_line(tmp_path):
    bad = _cli(tmp_path, "--validate", "experiment=demo", "optim.lr=-1e-4", f"output_dir={tmp_path / 'a'}")
    assert bad.returncode == 2 and bad.stderr.strip() == "config error: optim.lr=-0.0001 must be > 0", bad.stderr
    # only the launched job knows its world size: found at the run's start, reported the same way
    run = _cli(tmp_path, "experiment=demo", "cluster.trainer_devices=2", f"output_dir={tmp_path / 'b'}")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-3000:]
    assert lines[0].startswith("config error: cluster.trainer_devices=2 but this trainer job has WORLD_SIZE=1 ranks")
