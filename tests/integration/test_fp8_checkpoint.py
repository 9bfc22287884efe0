"""Blockwise FP8 checkpoints in (convert/fp8_io.py): a tiny DeepSeek-V3 written by tools/make_tiny_checkpoint.py
and quantized (every linear projection float8_e4m3fn + weight_scale_inv, `quantization_config` fp8 [128, 128]).

Oracles: transformers' own fine-grained FP8 loader (it dequantizes on a machine without a GPU) for the trainer's
log-probs after `init_from_hf`; our dequantization written as a plain FP32 checkpoint for the converter, whose
output must be the same tensors bit for bit. Other quantization formats are refused, naming the format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> SimpleNamespace:
    """`fp8`: the tiny DeepSeek-V3 quantized; `plain`: the same checkpoint before quantization; `ref`: the FP8 one
    dequantized by quant/fp8.py, written as a plain FP32 checkpoint."""
    import shutil

    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT / "tools"))
    from make_tiny_checkpoint import make_tiny_checkpoint

    from scalerl_mega.convert.fp8_io import quantize_hf_dir
    from scalerl_mega.convert.st_io import SafetensorsDir
    from scalerl_mega.quant.fp8 import dequantize_named

    tmp = tmp_path_factory.mktemp("tiny_fp8")
    plain = make_tiny_checkpoint("deepseek_v3", tmp / "plain")
    fp8_dir, ref_dir = tmp / "fp8", tmp / "ref"
    shutil.copytree(plain, fp8_dir)
    # 4 layers x 5 MLA projections, layer 0's dense MLP, layers 1-3: 8 experts x 3 + the shared experts' 3
    assert quantize_hf_dir(str(fp8_dir)) == 4 * 5 + 3 + 3 * (8 * 3 + 3)
    shutil.copytree(plain, ref_dir)
    src = SafetensorsDir(str(fp8_dir))
    deq = dict(dequantize_named((n, src.get(n)) for n in src.names()))
    assert all(t.dtype == torch.float32 for t in deq.values())
    save_file(deq, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    return SimpleNamespace(fp8=fp8_dir, plain=plain, ref=ref_dir)


def test_converter_dequantizes_an_fp8_checkpoint(tmp_path, tiny):
    import torch

    from scalerl_mega.convert.megatron_ckpt import MegatronShards
    from scalerl_mega.convert.pipeline import convert_hf_to_megatron

    fp8_dir, ref_dir = tiny.fp8, tiny.ref

    a = convert_hf_to_megatron(hf_dir=str(fp8_dir), out=str(tmp_path / "a"), dequantize_dtype=torch.float32)
    b = convert_hf_to_megatron(hf_dir=str(ref_dir), out=str(tmp_path / "b"))
    assert a.digest == b.digest and a.tensors == b.tensors  # the same Megatron tensors, bit for bit
    meta = json.loads((tmp_path / "a" / "megatron_convert.json").read_text())
    assert "quantization_config" not in meta["hf_config"]
    assert "quantization_config" not in json.loads((tmp_path / "a" / "hf" / "config.json").read_text())
    assert MegatronShards(str(tmp_path / "a")).dims.arch == "deepseek_v3"
    bf = convert_hf_to_megatron(hf_dir=str(fp8_dir), out=str(tmp_path / "bf"))  # default: config's dtype
    name = "decoder.layers.1.self_attention.linear_proj.weight"
    assert MegatronShards(str(tmp_path / "bf")).full_tensor(name).dtype == torch.float32  # the tiny one is FP32


def test_unsupported_quantization_is_named(tmp_path, tiny):
    import shutil

    from scalerl_mega.convert.pipeline import convert_hf_to_megatron
    from scalerl_mega.model.config import load_model_preset
    from scalerl_mega.model.hf_import import check_model_matches_hf, model_from_hf_dir

    fp8_dir = tmp_path / "gptq"
    shutil.copytree(tiny.fp8, fp8_dir)
    cfg = json.loads((fp8_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized"}
    (fp8_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"quant_method='compressed-tensors' is not supported"):
        convert_hf_to_megatron(hf_dir=str(fp8_dir), out=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match=r"init_from_hf=.*quant_method='compressed-tensors' is not supported"):
        model_from_hf_dir(fp8_dir)
    model = load_model_preset("tiny_deepseek_v3", overrides={"vocab_size": cfg["vocab_size"]})
    with pytest.raises(ValueError, match=r"init_from_hf=.*compressed-tensors"):
        check_model_matches_hf(model, fp8_dir)
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_hf_to_megatron.py"), "--hf-dir", str(fp8_dir),
                           "--out", str(tmp_path / "y"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "compressed-tensors" in proc.stderr


def worker(out: str, hf_dir: str) -> None:
    import torch

    from scalerl_mega.build import init_trainer_from_hf
    from scalerl_mega.model.config import MegatronConfig, OptimConfig, ParallelConfig, load_model_preset
    from scalerl_mega.model.hf_import import model_from_hf_dir
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from test_init_from_hf import random_sft_batch

    torch.set_num_threads(1)
    model = model_from_hf_dir(hf_dir, base=load_model_preset("tiny_deepseek_v3"))
    trainer = MegatronPolicyTrainer(MegatronConfig(model=model, parallel=ParallelConfig(), optim=OptimConfig(lr=1e-3)))
    try:
        ids, batch = random_sft_batch(model.vocab_size)
        loaded = init_trainer_from_hf(trainer, SimpleNamespace(init_from_hf=hf_dir, model=model))
        after = trainer.logprobs(batch)
        with open(out, "w") as f:
            json.dump({"ids": ids.tolist(), "after": after.tolist(), "n_loaded": len(loaded)}, f)
    finally:
        trainer.close()


@pytest.mark.slow  # ~75 s: a Megatron trainer in a subprocess
@pytest.mark.timeout(600)
def test_init_from_fp8_deepseek_v3_matches_transformers_fp8_loader(tmp_path, tiny):
    """The trainer initialised from the FP8 checkpoint gives the log-probs of transformers' model loaded from that
    same FP8 directory (its own dequantization), and not those of the unquantized weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from mp_launch import run_single_worker

    fp8_dir = tiny.fp8
    res = run_single_worker(__file__, tmp_path / "out.json", args=(str(fp8_dir),))
    ids = torch.tensor(res["ids"])

    def logp(model_dir: Path) -> torch.Tensor:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(ids[:, :-1]).logits.double()
        return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]

    after = torch.tensor(res["after"], dtype=torch.float64)
    assert (after - logp(fp8_dir)).abs().max() < 1e-5
    assert (after - logp(tiny.plain)).abs().max() > 1e-3  # the weights before FP8 give other log-probs
    assert res["n_loaded"] > 0


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    worker(sys.argv[2], sys.argv[3])
