"""Component factory: a validated TrainConfig -> the objects the loop drives (the seams of interfaces.py).

    task     synthetic arithmetic prompts (train / held-out validation) and the task's HF tokenizer
    sampler  curriculum (No-Positive-Resampling or uniform, paper Sec. 3.2)
    rewards  TaskRewardFn: math verifier with string fast path, in a worker pool
    trainer  Megatron-Core (CPU: gloo world of one) with the loop's policy loss
    engines  local HF engine process(es) with bucketed weight sync over torch.distributed, or SGLang

Each builder is small and separately callable (tests build only what they need). Heavy imports
happen inside the builders.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl_mega.config import (
    DataConfig,
    TrainConfig,
    check_tokenizer_fits,
    check_tokenizer_source,
    megatron_config,
    pause_mode,
)
from scalerl_mega.interfaces import LoopComponents, PolicyTrainer, RewardFn, RolloutEngine, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer

log = logging.getLogger("scalerl_mega.build")


# ----------------------------------------------------------------------------- task
@dataclass(kw_only=True)
class Task:
    """Prompts and tokenizer of the run."""

    tokenizer: Tokenizer
    train_prompts: list
    val_prompts: list
    stop_token_ids: list[int]
    interruption_ids: list[int]
    add_special_tokens: bool = True
    """False when prompt texts are already chat-formatted (the template writes BOS itself)."""

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def build_task(cfg: TrainConfig) -> Task:
    """data.name=synthetic: addition traces with the task's character tokenizer. polaris / deepcoder /
    math_code: `build_dataset_task`."""
    if cfg.data.name != "synthetic":
        return build_dataset_task(cfg)
    from scalerl_mega.data.tasks.arith import arith_prompts
    from scalerl_mega.data.tasks.tokenizer import build_arith_tokenizer, check_synthetic_vocab

    check_synthetic_vocab(vocab_size=int(cfg.model.vocab_size), interruption_phrase=cfg.length.interruption_phrase)
    tok = build_arith_tokenizer()
    num_val = int(cfg.data.val_prompts)
    train, val = arith_prompts(num_train=int(cfg.data.synthetic_num_prompts) - num_val, num_val=num_val,
                               seed=int(cfg.data.split_seed), max_digits=int(cfg.data.synthetic_max_digits),
                               difficulty_weights=[float(x) for x in cfg.data.synthetic_difficulty_weights] or None)
    interruption_ids = list(tok(cfg.length.interruption_phrase, add_special_tokens=False)["input_ids"])
    task = Task(tokenizer=tok, train_prompts=[], val_prompts=[], stop_token_ids=[tok.eos_token_id],
                interruption_ids=interruption_ids)
    where = f"data.name=synthetic, data.synthetic_max_digits={int(cfg.data.synthetic_max_digits)}"
    task.train_prompts = prompts_within_limit(task, train, cfg.data, where=where)
    task.val_prompts = prompts_within_limit(task, val, cfg.data, where=where, allow_none=True)
    return task


def prompts_within_limit(task: Task, prompts: list, data: DataConfig, *, where: str, allow_none: bool = False) -> list:
    """`prompts` tokenised by `task` (`token_ids` set) and kept when within `data.max_prompt_tokens`;
    drops are logged. ValueError naming the key (and the prompt lengths) when none fits, unless
    `allow_none` (or there were none)."""
    limit = int(data.max_prompt_tokens)
    for p in prompts:
        p.token_ids = task.encode(p.text)
    kept = [p for p in prompts if len(p.token_ids) <= limit]
    if len(kept) < len(prompts):
        log.warning("dropped %d of %d prompts longer than data.max_prompt_tokens=%d", len(prompts) - len(kept),
                    len(prompts), limit)
    if prompts and not kept and not allow_none:
        lens = [len(p.token_ids) for p in prompts]
        raise ValueError(f"no prompt fits data.max_prompt_tokens={limit}: the {len(prompts)} prompts are "
                         f"{min(lens)}-{max(lens)} tokens ({where})")
    return kept


def load_tokenizer(path: str, *, key: str = "data.tokenizer_path") -> Any:
    """The HF tokenizer saved in local directory `path` (no downloads); ValueError naming `key`."""
    if not path:
        raise ValueError(f"{key} is empty: the dataset tasks need a local HF tokenizer directory "
                         "(set data.tokenizer_path, or init_from_hf to use the policy checkpoint's tokenizer)")
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"{key}={path!r}: no such directory")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{key}={path!r}: not a loadable HF tokenizer directory ({exc})") from exc


def build_dataset_task(cfg: TrainConfig) -> Task:
    """Polaris (math), Deepcoder (code) or both (math_code) from local files (paper App. A.3, Sec. 5).

    Rows are read with `data.sources.load_prompts` (JSONL / Parquet / local HF datasets) from
    `data.train_files` (Polaris schema for polaris/math_code, Deepcoder for deepcoder) and
    `data.code_files` (Deepcoder, math_code only); prompt text through the tokenizer's chat template
    when it has one and `data.use_chat_template`, else the task's plain template; columns and template
    per `data.prompt_key` / `data.answer_key` / `data.template` (data/columns.py). Prompts longer than
    `data.max_prompt_tokens` are dropped (logged). The held-out validation set is `data.split.held_out_split` over all prompts (`data.val_prompts`, `data.split_seed`;
    paper Sec. 2: 1,000 held out).
    """
    from scalerl_mega.data.columns import check_data_files, check_data_keys
    from scalerl_mega.data.sources import load_prompts
    from scalerl_mega.data.split import held_out_split

    data = cfg.data
    check_data_keys(data)
    check_tokenizer_source(cfg)
    tok_path, tok_key = str(data.tokenizer_path), "data.tokenizer_path"
    if not tok_path and str(getattr(cfg, "init_from_hf", "")):
        tok_path, tok_key = str(cfg.init_from_hf), "init_from_hf"  # the policy checkpoint's own tokenizer
    tok = load_tokenizer(tok_path, key=tok_key)
    check_tokenizer_fits(tok, cfg, key=tok_key, path=tok_path)
    chat = bool(data.use_chat_template) and bool(getattr(tok, "chat_template", None))
    prompts, sources = [], check_data_files(data)
    for key, files, schema in sources:
        for f in files:
            prompts += load_prompts(f, schema=schema, tokenizer=tok if chat else None).prompts
    task = Task(tokenizer=tok, train_prompts=[], val_prompts=[], stop_token_ids=[int(tok.eos_token_id)],
                interruption_ids=[], add_special_tokens=not chat)
    kept = prompts_within_limit(task, prompts, data, where=f"files: {[f for _, fs, _ in sources for f in fs]}")
    if not kept:
        raise ValueError(f"no prompt in files {[f for _, fs, _ in sources for f in fs]}")
    task.train_prompts, task.val_prompts = held_out_split(kept, num_val=int(data.val_prompts),
                                                          seed=int(data.split_seed))
    task.interruption_ids = list(tok(cfg.length.interruption_phrase, add_special_tokens=False)["input_ids"])
    return task


def build_sampler(cfg: TrainConfig, task: Task):
    from scalerl_mega.data.curriculum import Curriculum

    return Curriculum(task.train_prompts, name=cfg.curriculum.name,
                      pass_rate_threshold=cfg.curriculum.pass_rate_threshold, seed=int(cfg.seed),
                      min_active=int(cfg.train.prompts_per_step))


def build_reward_fn(cfg: TrainConfig, *, num_workers: int | None = None):
    """The `reward` group's RewardFn (rewards/custom.py): math verifier / code sandbox (+1/-1, paper
    App. A.3) or a custom `_target_` callable, in `reward.num_workers` pool workers."""
    from scalerl_mega.rewards.custom import reward_fn_from_settings

    return reward_fn_from_settings(getattr(cfg, "reward", None), num_workers=num_workers)


# ----------------------------------------------------------------------------- trainer
def use_fused_cispo(cfg: TrainConfig) -> bool:
    """The fused FP32 CISPO head (`train.fused_cispo`, on by default) applies to loss=cispo with the
    FP32 head (paper Sec. 3.2) without an IS correction (`loss.is_correction`: its masks need the
    trainer's log-probs before the loss; objective/is_correction.py) at sampling temperature 1 (the
    fused head computes softmax(logits); the logits path divides by `rollout.temperature`); every other
    combination keeps the logits path."""
    return (bool(cfg.train.fused_cispo) and cfg.loss.name == "cispo" and cfg.precision.name == "fp32_head"
            and cfg.loss.is_correction == "none" and float(cfg.rollout.temperature) == 1.0)


def build_trainer(cfg: TrainConfig):
    """The Megatron trainer with the loop's policy loss (next-token CE for SFT batches), the fused FP32
    CISPO head when `use_fused_cispo`, and micro-batches by the `train.micro_batch_tokens` budget."""
    from scalerl_mega.trainer.megatron.trainer import MegatronPolicyTrainer
    from scalerl_mega.trainer.policy_loss import make_cispo_head_loss_fn, make_policy_loss_fn

    loss_fn = make_policy_loss_fn(loss_type=cfg.loss.name, eps_low=cfg.loss.eps_low, eps_high=cfg.loss.eps_high,
                                  aggregation=cfg.aggregation.name, is_correction=cfg.loss.is_correction,
                                  is_cap=cfg.loss.is_cap, is_low=cfg.loss.is_low, is_high=cfg.loss.is_high)
    head_loss_fn = (make_cispo_head_loss_fn(eps_low=cfg.loss.eps_low, eps_high=cfg.loss.eps_high)
                    if use_fused_cispo(cfg) else None)
    return MegatronPolicyTrainer(megatron_config(cfg), loss_fn=loss_fn, head_loss_fn=head_loss_fn,
                                 micro_batch_tokens=int(cfg.train.micro_batch_tokens),
                                 pack_sequences=bool(cfg.train.pack_sequences))


def init_trainer_from_hf(trainer: PolicyTrainer, cfg: TrainConfig) -> list[str]:
    """Load `init_from_hf` (an HF checkpoint dir) into the trainer's sharded Megatron model.

    Each rank converts only the tensor groups it holds (convert/load.py); a config whose shapes differ
    from `model` fails listing every differing field (model/hf_import.py), before any weight is touched.
    """
    from scalerl_mega.convert.load import load_hf_checkpoint
    from scalerl_mega.model.hf_import import check_model_matches_hf

    path = str(cfg.init_from_hf)
    check_model_matches_hf(cfg.model, path)
    loaded = load_hf_checkpoint(trainer.chunks, path)
    trainer.optimizer.reload_model_params()  # mixed precision keeps fp32 main copies of the params
    if getattr(trainer, "peft", None) is not None:  # peft=lora: adapter checkpoints reference this base
        from scalerl_mega.trainer.megatron.lora_ckpt import base_reference

        trainer.peft_base = base_reference(path, seed=int(cfg.optim.seed), model_name=str(cfg.model.name))
    log.info("initialised the policy from %s (%d tensors)", path, len(loaded))
    return loaded


# ----------------------------------------------------------------------------- engines
def engine_max_seq_len(cfg: TrainConfig, task: Task) -> int:
    """Longest prompt + the largest output budget of any request."""
    from scalerl_mega.rollout.core import max_total_tokens
    from scalerl_mega.types import SamplingParams

    longest = max(len(task.encode(p.text)) for p in [*task.train_prompts, *task.val_prompts])
    sp = SamplingParams(max_new_tokens=cfg.length.max_new_tokens)
    if cfg.length.name == "interruption":
        sp.interruption_at = cfg.length.interruption_max
        sp.interruption_ids = list(task.interruption_ids)
        sp.answer_budget = cfg.length.answer_budget
    if cfg.env.name != "single":  # an episode's turns continue its ids up to the episode budget
        from scalerl_mega.config.env import episode_budget

        return longest + max(max_total_tokens(sp), episode_budget(cfg.env, max_new_tokens=cfg.length.max_new_tokens))
    return longest + max_total_tokens(sp)


def weight_sync_config(cfg: TrainConfig, *, backend: str, **kw: Any):
    """The trainer -> engine weight-sync settings of `rollout.*` (bucket size, flattened buckets) on `backend`."""
    from scalerl_mega.weight_sync import WeightSyncConfig

    return WeightSyncConfig(bucket_bytes=int(cfg.rollout.weight_sync_bucket_mb) << 20, backend=backend,
                            flattened=bool(cfg.rollout.weight_sync_flattened), **kw)


def build_local_engine(cfg: TrainConfig, task: Task, *, index: int = 0):
    """One LocalRolloutEngine process holding the HF twin of the trainer's model (random init; the
    loop pushes the trainer's weights before the first request); with `rollout.in_process`, the same
    engine in this process on the trainer's device (rollout/inprocess.py)."""
    from scalerl_mega.rollout.local import LocalRolloutEngine

    config = local_engine_config(cfg, task, index=index)
    if cfg.rollout.in_process:
        from scalerl_mega.rollout.inprocess import InProcessRolloutEngine

        return InProcessRolloutEngine(config)
    return LocalRolloutEngine(config)


def local_sync_backend(cfg: TrainConfig) -> str:
    """The process-group backend of the weight sync to local engines."""
    return "nccl" if cfg.cluster.device == "cuda" else "gloo"


def build_rank_sync(cfg: TrainConfig, trainer: MegatronPolicyTrainer, *, world_size: int):
    """This rank's per-stage weight sender (`rollout.weight_sync_senders=per_stage` on a trainer of several
    ranks; every rank builds one), else None: the one-sender push (a one-rank trainer is one sender anyway)."""
    if cfg.rollout.weight_sync_senders != "per_stage" or world_size == 1:
        return None
    from scalerl_mega.trainer.megatron.sync_senders import RankSync

    sync = weight_sync_config(cfg, backend=local_sync_backend(cfg))
    return RankSync(trainer, bucket_bytes=sync.bucket_bytes, flattened=sync.flattened, backend=sync.backend,
                    timeout_s=sync.timeout_s)


def local_engine_config(cfg: TrainConfig, task: Task, *, index: int = 0):
    """The `LocalEngineConfig` of local engine `index`."""
    from scalerl_mega.config import records_routes
    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec

    arch, hf_kwargs = hf_config_from_model(cfg.model)
    max_seq = engine_max_seq_len(cfg, task)
    if max_seq > cfg.model.max_position_embeddings:
        raise ValueError(f"model.max_position_embeddings={cfg.model.max_position_embeddings} < longest request "
                         f"{max_seq} (prompt + length.max_new_tokens / interruption budget)")
    backend = local_sync_backend(cfg)
    return LocalEngineConfig(
        model=LocalModelSpec(arch=arch, config=hf_kwargs, init_seed=int(cfg.seed), dtype=cfg.precision.params_dtype,
                             quantization=str(cfg.rollout.quantization)),
        core=CoreConfig(max_batch=cfg.rollout.max_batch_size, max_seq_len=max_seq,
                        fp32_lm_head=cfg.precision.name == "fp32_head", eos_token_ids=list(task.stop_token_ids),
                        record_routes=records_routes(cfg)),
        sync=weight_sync_config(cfg, backend=backend, group_name=f"weight_update_group_{index}"),
        num_threads=cfg.rollout.engine_threads, nice=int(cfg.rollout.engine_nice), seed=int(cfg.seed) + index,
        device="cuda" if cfg.cluster.device == "cuda" else "cpu")


class EngineSet:
    """Several engines behind the RolloutEngine seam: prompts round-robin, weights to all."""

    def __init__(self, engines: list) -> None:
        self.engines = engines
        self._next = 0

    def submit(self, prompt, sampling, *, n: int, version: int, first_index: int = 0) -> None:
        self.engines[self._next].submit(prompt, sampling, n=n, version=version, first_index=first_index)
        self._next = (self._next + 1) % len(self.engines)

    def poll(self, timeout_s: float = 0.0) -> list:
        out: list = []
        share = timeout_s / len(self.engines)
        for e in self.engines:
            out += e.poll(0.0 if out else share)
        return out

    def update_weights(self, named_tensors, *, version: int) -> None:
        tensors = list(named_tensors)  # tiny models only: several receivers need the same stream
        for e in self.engines:
            e.update_weights(iter(tensors), version=version)

    def update_adapter(self, adapter_config, named_tensors, *, version: int) -> None:
        """The same LoRA adapter to every engine (`interfaces.AdapterEngine`); `last_sync_stats`: the tensors and
        bytes all engines received, and the seconds of the whole fan-out."""
        from scalerl_mega.weight_sync import SendStats

        tensors = list(named_tensors)  # adapters are small: every engine gets the same list
        total, t0 = SendStats(version=version), time.monotonic()
        for e in self.engines:
            e.update_adapter(adapter_config, iter(tensors), version=version)
            total.tensors += e.last_sync_stats.tensors
            total.bytes += e.last_sync_stats.bytes
        total.seconds = time.monotonic() - t0
        self.last_sync_stats = total

    # multi-sender sync (weight_sync.multi.MultiSyncEngine): every sender broadcasts to all engines at once, engine i
    # being rank i + 1 of each group; an update is applied by each engine when all its groups delivered
    @property
    def group_world_size(self) -> int:
        return 1 + len(self.engines)

    def join_groups(self, init_methods: dict[str, str]) -> None:
        for i, e in enumerate(self.engines):
            e.join_groups(init_methods, rank=i + 1, world_size=self.group_world_size)

    def wait_groups(self) -> None:
        for e in self.engines:
            e.wait_groups()

    def check_plan(self, plan, *, version: int) -> None:
        for e in self.engines:
            e.check_plan(plan, version=version)

    def announce_groups(self, plan, *, version: int) -> None:
        for e in self.engines:
            e.announce_groups(plan, version=version)

    def finish_groups(self, plan, *, version: int) -> None:
        """Wait for every engine (each bounded by its deadlines); the failures are raised after all."""
        from scalerl_mega.weight_sync import WeightSyncError

        errors = []
        for i, e in enumerate(self.engines):
            try:
                e.finish_groups(plan, version=version)
            except WeightSyncError as err:
                errors.append(f"engine {i}: {err}")
        if errors:
            raise WeightSyncError("; ".join(errors))

    def pause(self) -> None:
        for e in self.engines:
            e.pause()

    def resume(self) -> None:
        for e in self.engines:
            e.resume()

    def close(self) -> None:
        for e in self.engines:
            e.close()

    @property
    def pids(self) -> list[int]:
        return [getattr(e, "pid", None) for e in self.engines]

    def weights_digest(self) -> dict:
        """The engines' common weights fingerprint and version (`metrics.weights_digest`); engines that hold
        different weights or versions give every engine's fingerprint, joined, so no export can equal it."""
        every = [e.weights_digest() for e in self.engines]
        if all(d["weights_sha256"] == every[0]["weights_sha256"] and d["version"] == every[0]["version"] for d in every):
            return every[0]
        return {"weights_sha256": " != ".join(d["weights_sha256"] for d in every),
                "version": min(d["version"] for d in every)}


def write_hf_checkpoint(cfg: TrainConfig, task: Task, trainer: PolicyTrainer, path: Path) -> Path:
    """The trainer's current weights as an HF model directory (config + safetensors + tokenizer):
    what an SGLang server loads at launch."""
    import torch

    from scalerl_mega.model.hf_export import hf_config_from_model
    from scalerl_mega.rollout.hf_params import checkpoint_target
    from scalerl_mega.rollout.local import LocalModelSpec
    from scalerl_mega.rollout.local import build_model as build_hf

    arch, hf_kwargs = hf_config_from_model(cfg.model)
    model = build_hf(LocalModelSpec(arch=arch, config=hf_kwargs))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in trainer.export_hf_weights():  # checkpoint names (Qwen3-MoE experts: fused-parameter slices)
            checkpoint_target(params, name).copy_(t)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    task.tokenizer.save_pretrained(path)
    return path


def sync_master_address(cfg: TrainConfig) -> str:
    """The address attached servers connect to for weight sync: `rollout.sync_master_address`, else
    127.0.0.1 when every engine URL names this host, else this host's name."""
    import socket
    from urllib.parse import urlparse

    if cfg.rollout.sync_master_address:
        return cfg.rollout.sync_master_address
    local = {"127.0.0.1", "localhost", socket.gethostname(), socket.gethostname().split(".")[0]}
    hosts = {urlparse(u).hostname for u in cfg.rollout.engine_urls}
    return "127.0.0.1" if hosts <= local else socket.getfqdn()


def sglang_route_layout(cfg: TrainConfig):
    """The `RouteLayout` of `meta_info.routed_experts` when the generators record routes
    (`config.records_routes`: an MoE model with replay on or `moe.record_routes=true`), else None
    (routes not requested)."""
    from scalerl_mega.config import records_routes
    from scalerl_mega.rollout.sglang import RouteLayout

    m = cfg.model
    if not records_routes(cfg):
        return None
    return RouteLayout(num_hidden_layers=m.num_layers, topk=m.moe_topk, num_experts=m.num_experts,
                       moe_layers=tuple(i for i in range(m.num_layers) if m.is_moe_layer(i)))


def check_sglang_model(cfg: TrainConfig) -> tuple[str, dict]:
    """The served model's HF (arch, config kwargs); ValueError for a model SGLang would load differently."""
    from scalerl_mega.convert.hf_layout import CAUSAL, sglang_warnings
    from scalerl_mega.model.archs import arch_of
    from scalerl_mega.model.hf_export import hf_config_from_model

    arch, hf_kwargs = hf_config_from_model(cfg.model)
    if arch == "qwen3_moe" and (bad := sglang_warnings(CAUSAL, {"model_type": arch_of(arch).model_type, **hf_kwargs})):
        raise ValueError(f"model '{cfg.model.name}' with rollout.engine=sglang: {'; '.join(bad)}; use "
                         "model.tie_embeddings=false and no model.moe_dense_layers / moe_layer_freq 1 with SGLang")
    return arch, hf_kwargs


def build_sglang_engine(cfg: TrainConfig, task: Task, trainer: PolicyTrainer):
    """SGLang servers (one per engine, consecutive ports) and the client engine over them; with
    `rollout.engine_urls` set, attach to those running servers instead (e.g. the generator job steps
    of slurm/common.sh) -- the loop pushes the trainer's weights before the first request."""
    from scalerl_mega.rollout.local import LocalModelSpec
    from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer, SGLangServerConfig
    from scalerl_mega.trainer.megatron.parallel import world_size_from_env

    pause = pause_mode(cfg.off_policy)
    routes = sglang_route_layout(cfg)
    arch, hf_kwargs = check_sglang_model(cfg)
    # its names/shapes (and FP8 scales): every push is checked before sending
    served = LocalModelSpec(arch=arch, config=hf_kwargs, quantization=str(cfg.rollout.quantization))
    if cfg.rollout.engine_urls:
        backend = "nccl" if cfg.cluster.device == "cuda" else "gloo"
        servers = [SGLangServer.attach(u, tp_size=cfg.rollout.sglang_tp_size) for u in cfg.rollout.engine_urls]
        for s in servers:
            s.wait_healthy(timeout_s=cfg.rollout.startup_timeout_s)
        log.info("attached to %d SGLang server(s): %s", len(servers), ", ".join(s.url for s in servers))
        return SGLangRolloutEngine(servers, config=SGLangEngineConfig(
            pause_mode=pause, seed=int(cfg.seed), master_address=sync_master_address(cfg), routes=routes, model=served,
            max_inflight_per_server=int(cfg.rollout.max_batch_size),
            sync=weight_sync_config(cfg, backend=backend)))
    path = write_hf_checkpoint(cfg, task, trainer, Path(cfg.output_dir) / "hf_init")
    if cfg.rollout.quantization == "fp8":  # the servers start FP8 (block scales), as every push then arrives
        from scalerl_mega.convert.fp8_io import quantize_hf_dir

        quantize_hf_dir(str(path))
    servers = []
    for i in range(cfg.rollout.num_engines):
        scfg = SGLangServerConfig(
            model_path=str(path), host=cfg.rollout.sglang_host, port=cfg.rollout.sglang_port + i,
            tp_size=cfg.rollout.sglang_tp_size, mem_fraction_static=cfg.rollout.sglang_mem_fraction,
            random_seed=int(cfg.seed), fp32_lm_head=cfg.precision.name == "fp32_head", pause_mode=pause,
            base_gpu_id=(cfg.cluster.trainer_devices or world_size_from_env()) + i * cfg.rollout.sglang_tp_size,
            startup_timeout_s=cfg.rollout.startup_timeout_s, return_routed_experts=routes is not None,
            dtype="float32" if cfg.precision.params_dtype == "float32" else "bfloat16",
            quantization=None if cfg.rollout.quantization == "none" else str(cfg.rollout.quantization),
            kv_cache_dtype=str(cfg.rollout.kv_cache_dtype), lora=sglang_lora_serving(cfg))
        servers.append(SGLangServer.launch(scfg))
    return SGLangRolloutEngine(servers, config=SGLangEngineConfig(
        pause_mode=pause, seed=int(cfg.seed), routes=routes, model=served,
        max_inflight_per_server=int(cfg.rollout.max_batch_size),
        sync=weight_sync_config(cfg, backend="nccl")))


def sglang_lora_serving(cfg: TrainConfig):
    """`peft=lora`: how launched SGLang servers serve the adapters (`launch.LoraServing`: `peft.rank` as the rank
    bound, the HF modules `peft.targets` export to, torch_native on a CPU, csgmv on a GPU); None otherwise."""
    if cfg.peft.kind != "lora":
        return None
    from scalerl_mega.config.peft import target_kinds
    from scalerl_mega.rollout.sglang.launch import LoraServing
    from scalerl_mega.trainer.megatron.lora_export import HF_SHORT

    short = sorted({s for k in target_kinds(list(cfg.peft.targets)) for s in HF_SHORT[k.split("_")[-1]]})
    return LoraServing(max_rank=int(cfg.peft.rank), target_modules=tuple(short),
                       backend="csgmv" if cfg.cluster.device == "cuda" else "torch_native")


def build_engine(cfg: TrainConfig, task: Task, trainer: PolicyTrainer):
    """The generators (controller rank only): SGLang servers or local engine process(es)."""
    import os

    # Under torchrun every TCP rendezvous defaults to the elastic agent's store
    # (TORCHELASTIC_USE_AGENT_STORE=True), so the trainer -- rank 0 and TCPStore master of the
    # weight-sync group -- would wait as a client on a port nobody serves (TCPStore connect
    # time-outs, measured under torchrun and on the local Slurm). The trainer's own process groups
    # exist already; the weight-sync groups created from here on are ours.
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    if cfg.rollout.name == "sglang":
        return episode_engine(cfg, task, build_sglang_engine(cfg, task, trainer))
    engines = [build_local_engine(cfg, task, index=i) for i in range(cfg.rollout.num_engines)]
    return episode_engine(cfg, task, engines[0] if len(engines) == 1 else EngineSet(engines))


def episode_engine(cfg: TrainConfig, task: Task, engine: RolloutEngine) -> RolloutEngine:
    """`engine` under the episode engine the run's `env` group wants (episodes/assemble.py): the one-turn episode
    (`env=single`), the episode driver (`env=custom`) or the agent endpoint (`env=agent`)."""
    from scalerl_mega.episodes.assemble import episode_engine as over

    return over(cfg, engine, task=task, max_seq_len=lambda: engine_max_seq_len(cfg, task))


def engine_weight_dtype(cfg: TrainConfig) -> str:
    """The dtype the generators hold their weights in, which every weight push is cast to on the
    training device (`export.weight_dtypes`): SGLang serves and the local engine builds its model in
    `precision.params_dtype`. SGLang holds its LM head in that dtype too (a pushed FP32 head is
    rounded on load; `--enable-fp32-lm-head` upcasts at compute), so its push sends the head in it;
    the local engine keeps an FP32 copy of the pushed head (rollout/core.py): "+fp32_head"."""
    from scalerl_mega.trainer.megatron.export import FP8_SYNC, FP32_HEAD

    dtype = str(cfg.precision.params_dtype)
    dtype = dtype + FP32_HEAD if cfg.rollout.name != "sglang" and cfg.model.fp32_lm_head else dtype
    return dtype + FP8_SYNC if cfg.rollout.quantization == "fp8" else dtype  # "+fp8": linear projections in FP8


def allocation_devices(cfg: TrainConfig, *, world_size: int) -> int:
    """Devices the scaling law's compute counts (`metrics.compute.allocation_devices`): the trainer
    job's (`cluster.trainer_devices`, 0 = its world size) plus the generators' total
    (`cluster.generator_devices`, 0 = engines x devices per engine)."""
    from scalerl_mega.metrics.compute import allocation_devices as count

    if cfg.rollout.in_process:  # the engine shares the trainer's device
        return int(cfg.cluster.trainer_devices) or world_size
    per_engine = int(cfg.rollout.sglang_tp_size) if cfg.rollout.name == "sglang" else 1
    gen = int(cfg.cluster.generator_devices)
    if gen and cfg.rollout.name == "sglang" and gen != cfg.rollout.num_engines * per_engine:
        log.warning("cluster.generator_devices=%d (counted) differs from rollout.num_engines x rollout.sglang_tp_size"
                    " = %d x %d", gen, cfg.rollout.num_engines, per_engine)
    return count(trainer_devices=int(cfg.cluster.trainer_devices) or world_size, generator_devices=gen,
                 num_engines=int(cfg.rollout.num_engines), devices_per_engine=per_engine)


# ----------------------------------------------------------------------------- all together
def build_components(cfg: TrainConfig, *, task: Task | None = None, trainer: PolicyTrainer | None = None,
                     engine: RolloutEngine | None = None, reward_fn: RewardFn | None = None,
                     sync_weights: Callable[..., dict[str, float]] | None = None) -> LoopComponents:
    """LoopComponents for `loop.run_rl` (pieces passed in are used as given; `sync_weights`: the per-stage
    weight push, `LoopComponents.sync_weights`)."""
    task = task or build_task(cfg)
    trainer = trainer or build_trainer(cfg)
    engine = engine or build_engine(cfg, task, trainer)
    return LoopComponents(
        engine=engine, trainer=trainer, reward_fn=reward_fn or build_reward_fn(cfg),
        sampler=build_sampler(cfg, task), val_prompts=list(task.val_prompts), decode=task.decode,
        weight_dtype=engine_weight_dtype(cfg), sync_weights=sync_weights, adapter_sync=cfg.peft.kind == "lora",
        encode=task.encode, stop_token_ids=list(task.stop_token_ids), interruption_ids=list(task.interruption_ids))
