"""The `quantization_config` of a Hugging Face `config.json`: which checkpoints the trainer reads (blockwise FP8,
dequantized on import) and what an FP8 checkpoint written here declares (`fp8_quantization_config`, the fields
of DeepSeek-V3 and Qwen3-*-FP8 that transformers' fine-grained FP8 loader and SGLang's `Fp8Config` read)."""

from __future__ import annotations

from collections.abc import Mapping
from scalerl_mega.jsonvalue import JSON
from scalerl_mega.quant.fp8 import BLOCK


def fp8_quantization_config(block: tuple[int, int] = BLOCK, *, not_convert: list[str] | None = None
                            ) -> dict[str, JSON]:
    """`quantization_config` of a blockwise FP8 checkpoint (weights e4m3, dynamic activation scales); with
    `not_convert` its `modules_to_not_convert` (quant.fp8.modules_to_not_convert: linear modules left unquantized
    that SGLang's `Fp8Config` would otherwise expect in FP8)."""
    out: dict[str, JSON] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [int(block[0]), int(block[1])]}
    if not_convert:
        out["modules_to_not_convert"] = list(not_convert)
    return out


def checkpoint_fp8_block(config: Mapping[str, JSON], *, where: str) -> tuple[int, int] | None:
    """The FP8 block size of a checkpoint whose `config.json` (or its `text_config`) is `config`; None when it
    is not quantized. ValueError naming `where`, the key and the format for any other quantization (the trainer
    reads blockwise FP8 only): another `quant_method` (compressed-tensors, GPTQ, AWQ, bitsandbytes, MXFP4 ...),
    per-tensor FP8 (no `weight_block_size`), or an FP8 format other than e4m3."""
    qc = config.get("quantization_config")
    text = config.get("text_config")
    if qc is None and isinstance(text, Mapping):
        qc = text.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise ValueError(f"{where}: quantization_config is a JSON {type(qc).__name__}, not an object")
    method = qc.get("quant_method")
    if method != "fp8":
        raise ValueError(f"{where}: quantization_config.quant_method={method!r} is not supported: the trainer reads "
                         "unquantized checkpoints and blockwise FP8 ones (quant_method='fp8' with weight_block_size, "
                         "as DeepSeek-V3 and Qwen3-*-FP8); dequantize this checkpoint first")
    block = qc.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ValueError(f"{where}: quantization_config.weight_block_size={block!r}: per-tensor FP8 (no block size) "
                         "is not supported; the trainer reads blockwise FP8 ([rows, cols] scale blocks)")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"{where}: quantization_config.fmt={fmt!r} is not supported (float8_e4m3fn weights only)")
    return int(block[0]), int(block[1])
