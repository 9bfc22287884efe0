"""What the local engine runs and serves: the model (`LocalModelSpec`, `build_model`, its weight manifest), the engine's
settings (`LocalEngineConfig`) and the requests of one prompt's samples (`make_requests`, seeds per sample). Shared by
the trainer-side handle (local.py), the engine process (engine_process.py) and the in-process engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalerl_mega.model.config import ARCHS
from scalerl_mega.rollout.core import CoreConfig, GenRequest
from scalerl_mega.weight_sync import WeightManifest, WeightSyncConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerl_mega.types import Prompt, SamplingParams


class EngineError(RuntimeError):
    """The engine process failed or did not answer in time."""


@dataclass(kw_only=True)
class LocalModelSpec:
    """A model for the local engine: an HF config (tiny random models) or a local HF directory."""

    arch: str = "llama"
    """A name of model/archs.py: "llama" (LlamaForCausalLM), "llama4" (Llama4ForCausalLM, text only), "qwen3"
    (Qwen3ForCausalLM), "qwen3_moe" (Qwen3MoeForCausalLM), "deepseek_v3", or a Gated DeltaNet hybrid:
    "qwen3_5" (Qwen3_5ForCausalLM), "qwen3_5_moe" (Qwen3_5MoeForCausalLM), "qwen3_next" (Qwen3NextForCausalLM)."""
    config: dict[str, Any] | None = None
    """Keyword arguments of the architecture's config class (`Arch.config_class`: LlamaConfig, Qwen3_5TextConfig,
    ...; random init with `init_seed`)."""
    path: str | None = None
    """A local HF model directory (config.json + safetensors); overrides `config`."""
    dtype: str = "float32"
    init_seed: int = 0
    quantization: str = "none"
    """"fp8": the engine serves blockwise FP8 weights (quant/fp8.py), as an SGLang server started on an FP8
    checkpoint does: weight pushes carry each linear projection in float8_e4m3fn with its `weight_scale_inv`
    (the manifest asks for them), and the model holds their dequantized values (its initial weights too)."""

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"LocalModelSpec.arch={self.arch!r} must be one of {ARCHS}")
        if (self.config is None) == (self.path is None):
            raise ValueError("LocalModelSpec: give exactly one of config= or path=")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"LocalModelSpec.dtype={self.dtype!r} must be float32, bfloat16 or float16")
        if self.quantization not in ("none", "fp8"):
            raise ValueError(f"LocalModelSpec.quantization={self.quantization!r} must be 'none' or 'fp8'")


def build_model(spec: LocalModelSpec, *, device: str = "cpu") -> Any:
    """Instantiate the HF causal LM (eval mode, SDPA attention)."""
    import torch

    dtype = getattr(torch, spec.dtype)
    if spec.path is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=dtype, attn_implementation="sdpa")
    else:
        model_cls, cfg = _class_and_config(spec)
        with torch.random.fork_rng():
            torch.manual_seed(spec.init_seed)
            model = model_cls(cfg)
        model = model.to(dtype)
    from scalerl_mega.rollout.hf_params import expose_router_biases

    model = expose_router_biases(model.to(device).eval())
    return _fp8_round_trip(model) if spec.quantization == "fp8" else model


def _fp8_round_trip(model: "torch.nn.Module") -> "torch.nn.Module":
    """Every FP8 checkpoint tensor of `model` replaced in place by its blockwise FP8 value (quantized, then
    dequantized), so that an FP8 engine serves FP8 weights from the start, before the first push."""
    import torch

    from scalerl_mega.quant.fp8 import dequantize_blockwise, is_fp8_weight, quantize_blockwise
    from scalerl_mega.rollout.hf_params import checkpoint_manifest, checkpoint_target

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, spec in checkpoint_manifest(model, source="engine model").specs.items():
            if is_fp8_weight(name, spec.shape):
                target = checkpoint_target(params, name)
                target.copy_(dequantize_blockwise(*quantize_blockwise(target), dtype=target.dtype))
    return model


def _class_and_config(spec: LocalModelSpec) -> tuple[Any, Any]:
    """(HF model class, its config) for a spec given by config kwargs."""
    import transformers

    from scalerl_mega.model.archs import arch_of

    arch = arch_of(spec.arch, where="LocalModelSpec")
    Model, Cfg = getattr(transformers, arch.causal_lm), getattr(transformers, arch.config_class)
    cfg = Cfg(**spec.config)
    cfg._attn_implementation = "sdpa"
    return Model, cfg


def model_manifest(spec: LocalModelSpec) -> "WeightManifest":
    """The checkpoint names and shapes of the model `spec` describes (`weight_sync.WeightManifest`; the
    names weights travel under, `hf_params.checkpoint_manifest`), from its HF class instantiated on the
    meta device: no weights are read or allocated."""
    import torch

    from scalerl_mega.rollout.hf_params import checkpoint_manifest, expose_router_biases

    with torch.device("meta"):
        if spec.path is not None:
            from transformers import AutoConfig, AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec.path))
            source = f"HF model at {spec.path}"
        else:
            model_cls, cfg = _class_and_config(spec)
            model = model_cls(cfg)
            source = f"{model_cls.__name__} from its config"
    manifest = checkpoint_manifest(expose_router_biases(model), source=source)
    return fp8_manifest(manifest) if spec.quantization == "fp8" else manifest


def fp8_manifest(manifest: WeightManifest) -> WeightManifest:
    """`manifest` as an FP8 generator accepts it: each FP8 weight in float8_e4m3fn followed by its float32 scale
    (`quant.fp8.quantized_shapes`); every other tensor as before."""
    from scalerl_mega.quant.fp8 import quantized_shapes
    from scalerl_mega.weight_sync import TensorSpec

    specs = [TensorSpec(n, shape, dt or s.dtype) for s in manifest.specs.values()
             for n, shape, dt in quantized_shapes(s.name, s.shape)]
    return WeightManifest(specs, aliases=manifest.aliases, source=f"{manifest.source}, blockwise FP8")


@dataclass(kw_only=True)
class LocalEngineConfig:
    model: LocalModelSpec
    core: CoreConfig = field(default_factory=CoreConfig)
    sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    num_threads: int = 1
    """torch threads in the engine process (1 is fastest on a contended 2-core machine)."""
    nice: int = 0
    """Added to the engine process's CPU niceness when it starts (`os.nice`; 0-19). Where the trainer and the
    engines share too few cores, a positive value lets the trainer run whenever it has work (its step is the
    one the engines wait on) and gives the engines the rest; 0 leaves the scheduler's even split."""
    seed: int = 0
    """Seeds requests submitted without `SamplingParams.seed`."""
    device: str = "cpu"
    master_address: str = "127.0.0.1"
    start_timeout_s: float = 180.0
    reply_timeout_s: float = 120.0
    parent_check_s: float = 1.0
    """How often the engine process checks that its parent is still alive (it exits if not)."""

    def __post_init__(self) -> None:
        if self.num_threads < 1:
            raise ValueError(f"LocalEngineConfig.num_threads={self.num_threads} must be >= 1")
        if not 0 <= self.nice <= 19:
            raise ValueError(f"LocalEngineConfig.nice={self.nice} must be in 0..19")
        if not self.parent_check_s > 0:
            raise ValueError(f"LocalEngineConfig.parent_check_s={self.parent_check_s} must be > 0")


def request_seed(base: int, prompt_id: str, index: int) -> int:
    """A stable per-sample seed for requests submitted without one."""
    import hashlib

    h = hashlib.blake2b(f"{base}/{prompt_id}".encode(), digest_size=7).digest()
    return int.from_bytes(h, "little") + index


def make_requests(
    prompt: "Prompt", sampling: "SamplingParams", *, n: int, version: int, base_seed: int, first_index: int = 0
) -> list[GenRequest]:
    """The n samples of a prompt, sample indices `first_index` + j for j < n: the j-th gets seed + j
    (SGLang `sampling_seed`, slime's scheme; `sampling.seed` is the first one's), or without a seed
    `request_seed` of its sample index. Request ids `<prompt_id>/<sample index>/v<version>`."""
    if prompt.token_ids is None:
        raise ValueError(f"prompt {prompt.prompt_id}: token_ids is None (tokenise before submit)")
    if n < 1:
        raise ValueError(f"submit n={n} must be >= 1")
    if first_index < 0:
        raise ValueError(f"submit first_index={first_index} must be >= 0")
    out = []
    for j in range(n):
        i = first_index + j
        seed = sampling.seed + j if sampling.seed is not None else request_seed(base_seed, prompt.prompt_id, i)
        out.append(
            GenRequest(
                rid=f"{prompt.prompt_id}/{i}/v{version}",
                prompt_id=prompt.prompt_id,
                sample_index=i,
                prompt_ids=list(prompt.token_ids),
                sampling=sampling,
                seed=seed,
                submitted_version=version,
            )
        )
    return out
