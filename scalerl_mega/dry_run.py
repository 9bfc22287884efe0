"""Full-scale dry run of the trainer layout on one CPU (`scalerl-train ... dry_run=true output_dir=DIR`).

For a world of `cluster.trainer_devices` ranks, one CPU process joins a *fake* process group
(torch's "fake" backend: collectives are no-ops) as a chosen rank, initialises Megatron's real
parallel state (TP/CP/PP/EP/ETP/DP groups), and builds the real model, mixed-precision wrapper, DDP
buffers and (distributed) optimizer exactly as `MegatronPolicyTrainer` does, except that every tensor
lives on the meta device: shapes and dtypes are real, no parameter memory is allocated. This is
repeated for one rank of every role (first / middle / last pipeline stage; first and last expert-
parallel rank), so a layout Megatron cannot initialise fails here, on a CPU, in seconds.

Per rank it reports the bytes of
* parameters (bf16 body; FP32 output layer under `precision=fp32_head`),
* gradients (the DDP gradient buffers as allocated, FP32 with `grad_reduce_in_fp32`),
* optimizer state (the FP32 main-parameter copies Megatron allocates, sharded by the distributed
  optimizer, plus Adam's two FP32 moments for every parameter the torch optimizer steps; torch
  allocates those at the first step),
* activations: an estimate (cluster/plan.py, Korthikanti et al. 2022) at the configured micro-batch
  (`train.micro_batch_tokens` tokens of rows up to prompt + generation length) with `train.recompute`,
* runtime: CUDA context, NCCL communicator buffers, the fused LM head's transients (FP32 grad_W
  [V/tp, H], the dlogits buffer, FP32 hidden copies), MoE route tensors and allocator fragmentation
  (`cluster.plan.runtime_bytes`: the formulas are in cluster/plan.py's module doc),
and the generator's weights + KV cache for one prompt's group of full-length sequences. `peak_bytes` is
the sum; `devices` says for H100 80 GB, H200 141 GB and GB200 186 GB whether the planned peak (`trainer_plan`) stays
within the device's memory less the planner's margin (`plan.MARGIN_FRACTION`).

Output (interface read by outside tooling): `output_dir/dry_run.json` =
`{"world_size": W, "ranks": {"<rank>": {"params", "params_bytes", "grads_bytes", "optimizer_bytes",
"activations_bytes", ...}}, ...}` and the same as a table on stdout; exit 0. A layout that cannot
initialise exits 2 with a message naming the keys; so does one whose planned peak (`trainer_plan`, the figure of
tools/plan.py and the Slurm launch check) does not fit `dry_run_gpu` (any of the planner's GPUs when empty).
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

GiB = 1024**3
EXIT_BAD_LAYOUT = 2
PEAK_PARTS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")


class LayoutError(ValueError):
    """The configured layout cannot initialise (message names the keys)."""


@dataclass(frozen=True, kw_only=True)
class Role:
    rank: int
    pp_rank: int
    ep_rank: int
    name: str


# ----------------------------------------------------------------------------- ranks
def representative_ranks(parallel, world_size: int) -> list[Role]:
    """One rank per role: pipeline stages first, (middle,) last; expert ranks first and last.

    Megatron's rank order is tp-cp-ep-dp-pp for dense groups (pp outermost) and tp-ep-dp-pp with
    tp = etp for expert groups, so stage s starts at rank s * world / pp and the last expert rank of
    that stage is etp * (ep - 1) further on. (Checked against parallel_state after initialisation.)
    """
    per_stage = world_size // parallel.pp
    stages = sorted({0, min(1, parallel.pp - 1), parallel.pp - 1})
    roles = []
    for stage in stages:
        name = "first" if stage == 0 else ("last" if stage == parallel.pp - 1 else "middle")
        if parallel.pp == 1:
            name = "only"
        base = stage * per_stage
        roles.append(Role(rank=base, pp_rank=stage, ep_rank=0, name=f"pp {name}"))
        if parallel.ep > 1:
            last_ep = base + parallel.expert_tp() * (parallel.ep - 1)
            roles.append(Role(rank=last_ep, pp_rank=stage, ep_rank=parallel.ep - 1,
                              name=f"pp {name}, ep {parallel.ep - 1}"))
    return roles


# ----------------------------------------------------------------------------- scoped shims
def _meta_mode():
    """Every factory call and device move lands on the meta device (shapes and dtypes only)."""
    import torch
    from torch.overrides import TorchFunctionMode

    moves = (torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.pin_memory)

    class ToMeta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in moves:
                return args[0]
            if "device" in kwargs:
                kwargs["device"] = "meta"
            if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], (str, torch.device, int)):
                args = (args[0], *args[2:])
            return func(*args, **kwargs)

    return ToMeta()


@contextlib.contextmanager
def _fake_world(rank: int, world_size: int) -> Iterator[None]:
    """A fake default process group (no communication) for `rank` of `world_size`.

    `all_gather_object` is replaced for the duration: on the fake backend it would return nothing
    (Megatron uses it to check that every rank built the same parameter groups), so every rank
    "reports" this rank's object, which is what a homogeneous layout would gather.
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("dry run: a process group already exists in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    saved = dist.all_gather_object

    def all_gather_object(object_list, obj, group=None):
        for i in range(len(object_list)):
            object_list[i] = obj

    dist.all_gather_object = all_gather_object
    try:
        yield
    finally:
        dist.all_gather_object = saved
        from scalerl_mega.trainer.megatron.parallel import teardown_parallel

        teardown_parallel()


# ----------------------------------------------------------------------------- sizes
def _unique_params(module) -> list:
    seen, out = set(), []
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_bytes(optimizer) -> int:
    """FP32 main-parameter copies Megatron allocated + Adam's two moments per stepped parameter."""
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    total = 0
    for sub in subs:
        for attr in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups"):
            for group in getattr(sub, attr, None) or []:
                total += _nbytes(group)
        cfg = sub.config
        moment = (_dtype_size(cfg.exp_avg_dtype) + _dtype_size(cfg.exp_avg_sq_dtype))
        for group in sub.optimizer.param_groups:
            total += sum(p.numel() for p in group["params"]) * moment
    return total


def _dtype_size(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def grads_bytes(ddp) -> int:
    """The DDP gradient buffers (dense and expert) as allocated."""
    return sum(_nbytes([b.grad_data]) for b in (*ddp.buffers, *ddp.expert_parallel_buffers))


# ----------------------------------------------------------------------------- per-rank build
def build_rank(mcfg, role: Role, world_size: int) -> dict[str, Any]:
    """Build `role.rank`'s model + DDP + optimizer on the meta device; return its sizes."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from scalerl_mega.trainer.megatron import cpu_compat, models, parallel, wrap

    cpu_compat.apply()
    with _fake_world(role.rank, world_size):
        try:
            parallel.init_megatron_groups(mcfg.parallel, create_gloo_process_groups=False)
        except Exception as exc:  # Megatron's own layout assertions
            raise LayoutError(_layout_message(mcfg.parallel, world_size, exc)) from exc
        got = (ps.get_pipeline_model_parallel_rank(), ps.get_expert_model_parallel_rank())
        if got != (role.pp_rank, role.ep_rank):
            raise RuntimeError(f"dry run: rank {role.rank} is pp/ep rank {got}, expected "
                               f"{(role.pp_rank, role.ep_rank)} (Megatron's rank order changed?)")
        tensor_parallel.model_parallel_cuda_manual_seed(mcfg.optim.seed)
        with torch.device("meta"), _meta_mode():
            gpt, tcfg = models.build_model(mcfg.model, mcfg.parallel, params_dtype=mcfg.params_dtype,
                                           recompute=mcfg.recompute, on_meta=True)
            ddp = wrap.wrap_model(gpt, tcfg, mcfg)
        optimizer = wrap.build_optimizer([ddp], mcfg, use_gloo_process_groups=False)
        params = _unique_params(gpt)
        if any(p.device.type != "meta" for p in params):
            raise RuntimeError("dry run: a parameter was allocated off the meta device")
        return {
            "params": sum(p.numel() for p in params),
            "params_bytes": _nbytes(params),
            "grads_bytes": grads_bytes(ddp),
            "optimizer_bytes": optimizer_bytes(optimizer),
            "role": role.name,
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "ep_rank": ps.get_expert_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank(),
            "dp": ps.get_data_parallel_world_size(),
            "expert_dp": ps.get_expert_data_parallel_world_size(),
            "distributed_optimizer": mcfg.distributed_optimizer(ps.get_data_parallel_world_size()),
        }


def _layout_message(par, world_size: int, exc: BaseException) -> str:
    keys = " ".join(f"parallel.{k}={getattr(par, k)}" for k in ("tp", "cp", "pp", "ep")) + f" parallel.etp={par.expert_tp()}"
    return (f"layout {keys} cannot initialise at world_size={world_size} (cluster.trainer_devices): "
            f"{type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------- estimates
def model_shape(model):
    """cluster.plan.ModelShape of a trainer ModelConfig."""
    from scalerl_mega.cluster.plan import ModelShape

    return ModelShape(name=model.name, hidden=model.hidden_size, layers=model.num_layers,
                      heads=model.num_attention_heads, kv_heads=model.num_query_groups, head_dim=model.kv_channels,
                      ffn=model.ffn_hidden_size, vocab=model.vocab_size, tied_embeddings=model.tie_embeddings,
                      num_experts=model.num_experts, top_k=model.moe_topk if model.is_moe else 0,
                      expert_ffn=model.expert_ffn if model.is_moe else 0,
                      shared_expert_ffn=model.shared_expert_ffn, moe_every=model.moe_layer_freq,
                      moe_dense=tuple(model.moe_dense_layers), qk_norm=model.qk_layernorm,
                      mla=(model.q_lora_rank or 0, model.kv_lora_rank, model.qk_rope_head_dim, model.v_head_dim)
                      if model.is_mla else (), gdn=_gdn_shape(model),
                      shared_expert_gate=bool(model.is_moe and model.moe_shared_expert_gate))


def _gdn_shape(model):
    """`ModelShape.gdn` of a Gated DeltaNet hybrid (None otherwise): its GDN layers, one GDN mixer's parameters
    (the gated norm's weight [linear_value_head_dim] replicated over TP), the recurrent + conv state of one sequence
    (FP32 state, bf16 conv cache) and the mixer's projections FP8 weight sync quantizes (model/hybrid.py
    `gdn_fp8_linears`)."""
    from scalerl_mega.cluster.gdn_shape import GDNShape
    from scalerl_mega.model.hybrid import gdn_fp8_linears, gdn_params, linear_layers, recurrent_state_bytes_per_sequence

    layers = linear_layers(model)
    if not layers:
        return None
    return GDNShape(layers=layers, mixer=gdn_params(model), replicated=model.linear_value_head_dim,
                    state_bytes=recurrent_state_bytes_per_sequence(model), fp8_linears=gdn_fp8_linears(model))


def sequence_shape(cfg) -> tuple[int, int]:
    """(seq_len, micro_batch rows): rows up to prompt + generation tokens, packed into the
    `train.micro_batch_tokens` budget (at least one row)."""
    longest = min(int(cfg.data.max_prompt_tokens) + int(cfg.length.max_new_tokens),
                  int(cfg.model.max_position_embeddings))
    seq = min(longest, int(cfg.train.micro_batch_tokens))
    return seq, max(1, int(cfg.train.micro_batch_tokens) // seq)


def train_layout(cfg, mcfg, world_size: int):
    from scalerl_mega.build import use_fused_cispo
    from scalerl_mega.cluster.plan import TrainLayout

    par = mcfg.parallel
    seq, mb = sequence_shape(cfg)
    chunk = None
    if use_fused_cispo(cfg):
        from scalerl_mega.objective.fused_logprob import default_chunk_size

        chunk = default_chunk_size(cfg.model.vocab_size // par.tp)
    dp = par.dp(world_size)
    return TrainLayout(tp=par.tp, pp=par.pp, dp=dp * par.cp, ep=par.ep, etp=par.expert_tp(),
                       fp32_head=bool(cfg.model.fp32_lm_head), fused_head=chunk is not None,
                       sequence_parallel=par.sequence_parallel_on(mcfg.model),
                       distributed_optimizer=mcfg.distributed_optimizer(dp), recompute=mcfg.recompute,
                       micro_batch=mb, seq_len=seq, logits_chunk_tokens=chunk)


def trainer_plan(cfg, *, world_size: int, device):
    """The one per-GPU memory answer for a run's trainer layout on `device` (a `plan.Device`): the planned peak of
    its most loaded pipeline stage (`plan.trainer_memory`). The meta-device dry run's verdict, the Slurm launch
    check (cluster/launch_config.py) and `tools/plan.py` all give this figure for the same layout."""
    from scalerl_mega.build import megatron_config
    from scalerl_mega.cluster.plan import trainer_memory

    mcfg = megatron_config(cfg)
    shape, layout = model_shape(mcfg.model), train_layout(cfg, mcfg, world_size)
    peft = getattr(cfg, "peft", None)
    if peft is not None and peft.kind == "lora":  # frozen base, adapters trained (cluster/plan_lora.py)
        from scalerl_mega.cluster.plan_lora import lora_trainer_memory
        from scalerl_mega.config.peft import target_kinds

        return lora_trainer_memory(shape, layout, device, rank=int(peft.rank), kinds=target_kinds(list(peft.targets)))
    return trainer_memory(shape, layout, device)


def generator_estimate(cfg) -> dict[str, Any]:
    """Per-GPU generator bytes (SGLang TP `rollout.sglang_tp_size`, body dtype `precision.params_dtype`):
    weights and the KV cache of `train.generations_per_prompt` full-length sequences (with a GDN hybrid's
    per-sequence recurrent + conv state), each cached K or V element in `rollout.kv_cache_dtype` (the servers'
    `--kv-cache-dtype`: auto is the body dtype, FP8 one byte)."""
    from scalerl_mega.cluster.plan import GenLayout, generator_weight_bytes, kv_bytes_per_token
    from scalerl_mega.config.rollout import kv_cache_element_bytes

    shape = model_shape(cfg.model)
    scale = 2 if cfg.precision.params_dtype == "float32" else 1
    seq, _ = sequence_shape(cfg)
    kv_dtype = str(cfg.rollout.kv_cache_dtype)
    lay = GenLayout(tp=int(cfg.rollout.sglang_tp_size), seq_len=seq, min_seqs=int(cfg.train.generations_per_prompt),
                    kv_bytes=kv_cache_element_bytes(kv_dtype, model_bytes=2 * scale),
                    quantization=str(cfg.rollout.quantization))
    lay.validate(shape)
    per_tok, state = kv_bytes_per_token(shape, lay), shape.gdn_state_bytes(lay.tp)
    return {"tp": lay.tp, "weights_bytes": generator_weight_bytes(shape, lay) * scale, "kv_cache_dtype": kv_dtype,
            "kv_bytes_per_token": per_tok, "kv_cache_bytes": (per_tok * seq + state) * lay.min_seqs,
            "kv_sequences": lay.min_seqs, "seq_len": seq}


# ----------------------------------------------------------------------------- driver
def dry_run(cfg, *, cache: dict | None = None) -> dict[str, Any]:
    """Build every role of the configured layout on the meta device; the dry_run.json payload.

    `cache`: a dict reused across calls; a rank of an identical trainer config (model, layout,
    precision, optimizer, recompute) is then built once (the startup-net test runs many overlays).
    Raises LayoutError (naming the keys) when the layout cannot initialise.
    """
    from scalerl_mega.build import megatron_config
    from scalerl_mega.cluster.plan import DEVICES, runtime_bytes, stage_activation_bytes

    from scalerl_mega.trainer.megatron.parallel import world_size_from_env

    # cluster.trainer_devices=0 (local clusters): the launched world size, 1 without a launcher
    world = int(cfg.cluster.trainer_devices) or world_size_from_env()
    mcfg = megatron_config(cfg)
    try:
        if world < 1:
            raise ValueError(f"cluster.trainer_devices={world} must be >= 1")
        mcfg.validate(world_size=world)
    except ValueError as exc:
        raise LayoutError(f"{exc} (world_size={world} = cluster.trainer_devices)") from exc
    layout = train_layout(cfg, mcfg, world)
    shape = model_shape(mcfg.model)
    ranks = {}
    for role in representative_ranks(mcfg.parallel, world):
        key = (repr(mcfg), world, role)
        if cache is not None and key in cache:
            entry = dict(cache[key])
        else:
            entry = build_rank(mcfg, role, world)
            if cache is not None:
                cache[key] = dict(entry)
        entry["activations_bytes"] = stage_activation_bytes(shape, layout, role.pp_rank)
        entry["runtime_bytes"] = runtime_bytes(shape, layout, role.pp_rank, activations=entry["activations_bytes"])
        entry["peak_bytes"] = sum(entry[c] for c in PEAK_PARTS) + sum(entry["runtime_bytes"].values())
        ranks[str(role.rank)] = entry
    par = mcfg.parallel
    return {
        "world_size": world,
        "ranks": ranks,
        "model": _model_label(mcfg.model),
        "layout": {"tp": par.tp, "cp": par.cp, "pp": par.pp, "ep": par.ep, "etp": par.expert_tp(),
                   "dp": par.dp(world), "expert_dp": par.edp(world),
                   "sequence_parallel": par.sequence_parallel_on(mcfg.model),
                   "distributed_optimizer": layout.distributed_optimizer},
        "precision": {"params_dtype": mcfg.params_dtype, "fp32_lm_head": bool(mcfg.model.fp32_lm_head),
                      "grad_reduce_in_fp32": mcfg.grad_reduce_in_fp32},
        "activations": {"recompute": mcfg.recompute, "seq_len": layout.seq_len, "micro_batch": layout.micro_batch,
                        "logits_chunk_tokens": layout.logits_chunk_tokens},
        "generator": generator_estimate(cfg),
        "devices": device_fit(cfg, world, DEVICES.values()),
    }


def device_fit(cfg, world_size: int, devices) -> dict[str, dict[str, Any]]:
    """{device name: {"planned_peak_bytes", "budget_bytes", "fits"}}: `trainer_plan` on each device."""
    out = {}
    for d in devices:
        rep = trainer_plan(cfg, world_size=world_size, device=d)
        out[d.name] = {"planned_peak_bytes": rep.total_bytes, "budget_bytes": rep.budget_bytes, "fits": rep.fits}
    return out


def fit_failure(result: dict[str, Any], gpu: str) -> str | None:
    """None when the planned peak fits `gpu` (any of the planner's GPUs when empty), else the message."""
    devs = result["devices"]
    peak = next(iter(devs.values()))["planned_peak_bytes"] / GiB
    if gpu and not devs[gpu]["fits"]:
        return (f"the trainer layout plans {peak:.2f} GiB per GPU, more than {gpu}'s "
                f"{devs[gpu]['budget_bytes'] / GiB:.2f} GiB (dry_run_gpu={gpu}; tools/plan.py suggests a layout that fits)")
    if not gpu and not any(d["fits"] for d in devs.values()):
        return (f"the trainer layout plans {peak:.2f} GiB per GPU: it fits none of "
                + ", ".join(f"{n} ({d['budget_bytes'] / GiB:.2f} GiB)" for n, d in devs.items())
                + "; tools/plan.py suggests a layout that fits")
    return None


def _model_label(model) -> str:
    """The Hydra `model=` choice when running under Hydra, else the config's name."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.choices["model"])
    except (ValueError, KeyError):  # not under Hydra ("HydraConfig was not set"), or no model choice
        return model.name


def format_table(result: dict[str, Any]) -> str:
    lay = result["layout"]
    head = (f"dry run: {result['model']} on {result['world_size']} trainer ranks, tp={lay['tp']} cp={lay['cp']} "
            f"pp={lay['pp']} ep={lay['ep']} etp={lay['etp']} dp={lay['dp']} expert_dp={lay['expert_dp']} "
            f"sp={lay['sequence_parallel']} distopt={lay['distributed_optimizer']} "
            f"params={result['precision']['params_dtype']} fp32_head={result['precision']['fp32_lm_head']} "
            f"recompute={result['activations']['recompute']}")
    cols = PEAK_PARTS
    lines = [head, f"{'rank':>6} {'role':<18} {'params':>14} " + " ".join(f"{c[:-6] + ' GiB':>14}" for c in cols)
             + f" {'runtime GiB':>12} {'peak GiB':>10}"]
    for rank, e in result["ranks"].items():
        lines.append(f"{rank:>6} {e['role']:<18} {e['params']:>14,} "
                     + " ".join(f"{e[c] / GiB:>14.2f}" for c in cols)
                     + f" {sum(e['runtime_bytes'].values()) / GiB:>12.2f} {e['peak_bytes'] / GiB:>10.2f}")
    planned = next(iter(result["devices"].values()))["planned_peak_bytes"] / GiB
    lines.append("runtime = CUDA context + NCCL buffers + fused-head transients + MoE route tensors + fragmentation "
                 f"(cluster/plan.py); planned peak {planned:.2f} GiB per GPU (tools/plan.py's figure); "
                 "fits (within memory less a 5% margin): "
                 + ", ".join(f"{name} {'yes' if d['fits'] else 'NO'}" for name, d in result["devices"].items()))
    g = result["generator"]
    lines.append(f"generator (tp={g['tp']}): weights {g['weights_bytes'] / GiB:.2f} GiB + KV "
                 f"{g['kv_cache_bytes'] / GiB:.2f} GiB ({g['kv_sequences']} x {g['seq_len']} tokens, kv_cache_dtype "
                 f"{g['kv_cache_dtype']}) per GPU")
    return "\n".join(lines)


def run_and_exit(cfg) -> None:
    """`dry_run=true`: write `output_dir/dry_run.json`, print the table, exit 0; exit 2 when the layout cannot
    initialise or its planned peak does not fit `dry_run_gpu` (any of the planner's GPUs when empty)."""
    import logging

    from scalerl_mega.cluster.plan import DEVICES

    logging.getLogger("megatron").setLevel(logging.WARNING)
    gpu = str(cfg.dry_run_gpu)
    if gpu and gpu not in DEVICES:
        print(f"dry run: dry_run_gpu={gpu!r} is not one of {sorted(DEVICES)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_LAYOUT)
    try:
        result = dry_run(cfg)
    except LayoutError as exc:
        print(f"dry run: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_LAYOUT)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dry_run.json").write_text(json.dumps(result, indent=1) + "\n")
    print(format_table(result), flush=True)
    problem = fit_failure(result, gpu)
    if problem:
        print(f"dry run: DOES NOT FIT: {problem}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_LAYOUT)
    sys.exit(0)
