"""The batched generation loop of the local engine (runs inside the engine process or test server).

`GenerationCore` owns an HF `transformers` causal LM and a `SlotKVCache`. Each `step()`:

1. decodes one token for every running request (one batched forward over the active slots),
2. admits waiting requests into free slots (one batched, left-padded prefill) and samples their
   first token, so finished requests are replaced at once: continuous batching.

Weight updates (`load_weights`) happen between steps; running requests keep their KV cache,
which was computed with the old weights (PipelineRL in-flight semantics, paper Sec. 3.1). Every
output token records the weight version whose forward produced its logits. LoRA adapters (`load_adapter`,
rollout/lora.py) bind per request instead: a request runs with the adapter, and is tagged with the version,
current at its first admission.

Forced interruption (paper Sec. 2 / App. A.11): once a request has sampled `interruption_at`
tokens, the phrase `interruption_ids` is fed token by token (log-prob 0.0, loss mask 0) and the
request may then generate `answer_budget` more tokens. Its finish reason is INTERRUPTED if it then
stops within that budget, LENGTH (a truncation, App. A.13) if the answer budget runs out too.

Known limit: HF Llama-4's attention temperature tuning (NoPE layers) scales queries by the cache
column index rather than the position id; with left-padded slots these differ, which changes the
scale only past `floor_scale` (8192 by default) columns. Tiny and demo models never get there.

Counters (`stats()`, cumulative since construction): `busy_s` (wall seconds inside `step()`,
decode + prefill + sampling), `decode_steps` (batched decode forwards), `decode_tokens` (sum over
decode forwards of the batch size), `prefill_steps`/`prefill_tokens` (admission forwards and the
prompt tokens they computed: a shared prefill's copies are not counted, see `CoreConfig.share_prefill`).
The cluster simulator is calibrated on their per-step differences (`cluster/schedule_sim.py::calibration_from_records`).

Log-probs come from FP32 logits `hidden.float() @ W.float().T` when `fp32_lm_head` is on (W: an FP32
copy of the head taken from the synced tensor itself, so an FP32 trainer head arrives unrounded even
into a bf16 model), or, for the bf16-head ablation, from logits computed and left in the model dtype
(the log-softmax then runs in that dtype too, as on the trainer).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalerl_mega.rollout.hf_params import moe_layers, moe_routers  # noqa: F401  (moe_layers: re-exported)
from scalerl_mega.rollout.route_recorder import RouteRecorder
from scalerl_mega.types import Completion, FinishReason, SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel
    from scalerl_mega.rollout.lora import LoraAdapter


@dataclass(kw_only=True)
class CoreConfig:
    """Scheduler and numerics of a `GenerationCore`."""

    max_batch: int = 64
    """Slots: requests decoded together."""
    max_seq_len: int = 256
    """Longest prompt + output a request may reach; the KV cache holds 2x this many columns."""
    fp32_lm_head: bool = True
    """Log-probs from FP32 logits (paper Sec. 3.2); False reproduces the bf16-head ablation."""
    eos_token_ids: list[int] = field(default_factory=list)
    """Always-on stop tokens (SGLang stops on EOS unless ignore_eos)."""
    admit_min_free: int | None = None
    """Admit waiting requests only once this many slots are free (or nothing is running), so one
    prefill forward serves several newcomers; None = max(1, max_batch // 8)."""
    record_routes: bool = False
    """Record the MoE routes (expert ids + routing weights per input position and MoE layer) of every
    request into `Completion.routes` (rollout routing replay). Ignored for dense models."""
    share_prefill: bool = True
    """Prefill requests admitted together with the same input (a group's samples of one prompt) once and copy
    the KV row and logits to the others (`GenerationCore._prefill`; tested against share_prefill=False)."""
    sparse_moe: bool = True
    """Run HF Llama-4 MoE layers with sparse expert dispatch (`rollout/sparse_moe.py`: each expert on the
    tokens that selected it; same maths as HF's dense all-experts pass). Switches the model's MoE
    modules in place. CPU only: its per-expert row selection has data-dependent shapes, which on a
    GPU would synchronise with the host in every layer, so a CUDA model keeps HF's dense pass."""

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"CoreConfig.max_batch={self.max_batch} must be >= 1")
        if self.max_seq_len < 2:
            raise ValueError(f"CoreConfig.max_seq_len={self.max_seq_len} must be >= 2")


@dataclass(kw_only=True)
class GenRequest:
    """One sample to generate (picklable: it crosses the engine-process transport)."""

    rid: str
    prompt_id: str
    sample_index: int
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    submitted_version: int = 0


@dataclass
class _Row:
    req: GenRequest
    stop_ids: frozenset[int]
    limit: int
    t_submit: float
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    forced: deque = field(default_factory=deque)
    routes: list = field(default_factory=list)
    """Recorded route chunks: (ids [m, L, K], weights [m, L, K], version) for consecutive positions."""
    routes_n: int = 0
    """Positions with a recorded route (0..routes_n-1)."""
    adapter: str | None = None
    """The LoRA adapter this request runs with (`rollout/lora.py`), bound at its first admission; None: none."""
    bound_version: int | None = None
    """The weight version at its first admission: every token's version once adapters are served."""
    n_sampled: int = 0
    interrupted_at: int | None = None
    t_admit: float | None = None
    next_input: int | None = None
    pos: int = 0


def max_total_tokens(sampling: SamplingParams) -> int:
    """Upper bound on the output length of a request with these parameters."""
    limit = sampling.max_new_tokens
    if sampling.interruption_at is not None:
        limit = max(limit, sampling.interruption_at + len(sampling.interruption_ids) + sampling.answer_budget)
    return limit


class GenerationCore(RouteRecorder):
    """Batched sampling with a slot KV cache, continuous admission and in-flight weight loads."""

    def __init__(self, model: "PreTrainedModel", *, config: CoreConfig) -> None:
        import torch

        from scalerl_mega.rollout.kv_cache import SlotKVCache
        from scalerl_mega.rollout.recurrent_state import recurrent_spec

        self.model = model.eval()
        if config.sparse_moe and next(model.parameters()).device.type == "cpu":
            from scalerl_mega.rollout.sparse_moe import use_sparse_moe

            use_sparse_moe(model)
        self.config = config
        self.version = 0
        self.waiting: deque[_Row] = deque()
        self.rows: list[_Row] = []
        mcfg = model.config
        heads = mcfg.num_attention_heads
        head_dim = getattr(mcfg, "head_dim", None) or mcfg.hidden_size // heads
        param = next(model.parameters())
        self.device = param.device
        self.kv = SlotKVCache(
            num_layers=mcfg.num_hidden_layers, num_slots=config.max_batch, capacity=2 * config.max_seq_len,
            dtype=param.dtype, device=param.device, recurrent=recurrent_spec(model),
            **_kv_shape(mcfg, heads=heads, head_dim=head_dim),
        )
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._admit_min = config.admit_min_free or max(1, config.max_batch // 8)
        self._routers = moe_routers(model) if config.record_routes else []
        self._route_buf: list | None = None
        for router in self._routers:
            router.register_forward_hook(self._route_hook)
        self._w32 = None
        self._refresh_head()
        self._torch = torch
        self.lora = None  # the served LoRA adapters (`lora.MultiLoRA`), from the first `load_adapter` on
        self.adapter: str | None = None  # what newly admitted requests are bound to (the last one loaded)
        # the decode step builds its own masks only for SDPA over full and chunked attention layers and GDN layers
        # (anything else, e.g. sliding windows, a chunked layer without a chunk size, or non-SDPA attention, gets the
        # 2-D mask and HF's construction); a chunk no request outgrows (max_seq_len) is full attention
        layer_types = set(getattr(mcfg, "layer_types", None) or ["full_attention"])
        chunk = getattr(mcfg, "attention_chunk_size", None) if "chunked_attention" in layer_types else None
        self._linear = "linear_attention" in layer_types
        self._own_masks = (getattr(mcfg, "_attn_implementation", None) == "sdpa"
                           and layer_types <= {"full_attention", "chunked_attention", "linear_attention"}
                           and ("chunked_attention" not in layer_types or bool(chunk)))
        self._chunk = int(chunk) if chunk and int(chunk) < config.max_seq_len else None
        self._stats = dict.fromkeys(("busy_s", "decode_steps", "decode_tokens", "prefill_steps", "prefill_tokens"), 0)

    # ---- public API --------------------------------------------------------------------------
    def add(self, req: GenRequest) -> None:
        """Queue a request (ValueError if it cannot fit the cache or has bad parameters)."""
        sp = req.sampling
        if not req.prompt_ids:
            raise ValueError(f"request {req.rid}: empty prompt_ids")
        if sp.max_new_tokens < 1:
            raise ValueError(f"request {req.rid}: sampling.max_new_tokens={sp.max_new_tokens} must be >= 1")
        if sp.temperature < 0 or not 0.0 < sp.top_p <= 1.0:
            raise ValueError(
                f"request {req.rid}: sampling.temperature={sp.temperature} must be >= 0 and "
                f"sampling.top_p={sp.top_p} in (0, 1]"
            )
        if sp.interruption_at is not None and not sp.interruption_ids:
            raise ValueError(f"request {req.rid}: interruption_at set but interruption_ids empty")
        total = len(req.prompt_ids) + max_total_tokens(sp)
        if total > self.config.max_seq_len:
            raise ValueError(
                f"request {req.rid}: prompt ({len(req.prompt_ids)}) + output budget "
                f"({max_total_tokens(sp)}) = {total} exceeds max_seq_len={self.config.max_seq_len}"
            )
        bad = [t for t in req.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"request {req.rid}: prompt token ids {bad[:5]} outside vocab {self.vocab_size}")
        stop = frozenset(sp.stop_token_ids) | frozenset(self.config.eos_token_ids)
        self.waiting.append(_Row(req=req, stop_ids=stop, limit=sp.max_new_tokens, t_submit=time.monotonic()))

    @property
    def num_running(self) -> int:
        return len(self.rows)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.rows or self.waiting)

    def _holdable(self, r: _Row) -> bool:
        """The request may wait for a newer weight version (`SamplingParams.hold_at`)."""
        return r.req.sampling.hold_at is not None and self.version <= r.req.submitted_version

    def can_progress(self) -> bool:
        """There is work, and it is not all waiting for a weight update: decoding stops when every
        running and waiting request is holdable and some running one reached its `hold_at` (so the
        next update lands mid-generation, deterministically); a request without `hold_at`, or one
        whose weights were already updated, always keeps the engine decoding."""
        if not self.has_work():
            return False
        if not all(self._holdable(r) for r in self.rows) or not all(self._holdable(r) for r in self.waiting):
            return True
        return not any(len(r.output_ids) >= r.req.sampling.hold_at for r in self.rows)

    def step(self) -> list[Completion]:
        """Decode one token for all running requests, then admit waiting ones. Returns finished.
        Does nothing while `can_progress()` is False (held for a weight update)."""
        done: list[Completion] = []
        if not self.can_progress():
            return done
        st = self._stats
        t0 = time.perf_counter()
        with self._torch.inference_mode():
            if self.rows:
                st["decode_steps"] += 1
                st["decode_tokens"] += len(self.rows)
                logits = self._decode()
                done += self._consume(list(range(len(self.rows))), logits)
            free = self.config.max_batch - len(self.rows)
            if self.waiting and free > 0 and (free >= self._admit_min or not self.rows or free >= len(self.waiting)):
                new = [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
                for r in new:  # a request keeps the adapter (and version) of its first admission, also once retracted
                    if r.bound_version is None:
                        r.adapter, r.bound_version = self.adapter, self.version
                first = len(self.rows)
                st["prefill_steps"] += 1
                logits = self._prefill(new)  # counts the prompt tokens it computes
                done += self._consume(list(range(first, len(self.rows))), logits)
        st["busy_s"] += time.perf_counter() - t0
        return done

    def stats(self) -> dict[str, float]:
        """Cumulative work counters (see module doc); callers difference two snapshots."""
        return dict(self._stats)

    def run_until_done(self) -> list[Completion]:
        """Step until nothing is running or waiting (tests, benchmarks, health checks)."""
        out: list[Completion] = []
        while self.can_progress():
            out += self.step()
        return out

    def check_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> list[tuple[str, Any, "torch.Tensor"]]:
        """Resolve HF names to parameters without touching the model: [(name, parameter, tensor)].

        Names are checkpoint names (`hf_params.checkpoint_target`: a Qwen3-MoE expert's tensors load into
        its slice of the fused expert parameter); `lm_head.weight` is accepted for tied embeddings, and the
        `weight_scale_inv` of a blockwise FP8 weight (quant/fp8.py) with its block grid's shape (resolved to
        the weight's parameter). The first unknown name or shape mismatch raises ValueError naming the tensor."""
        from scalerl_mega.quant.fp8 import SCALE_SUFFIX, scale_shape
        from scalerl_mega.rollout.hf_params import checkpoint_target

        params = dict(self.model.named_parameters())
        emb = self.model.get_input_embeddings().weight
        tied = self.model.get_output_embeddings().weight is emb
        out = []
        for name, tensor in named_tensors:
            scale = name.endswith(SCALE_SUFFIX)
            p = checkpoint_target(params, name[: -len(SCALE_SUFFIX)] if scale else name)
            if p is None and tied and name == "lm_head.weight":
                p = emb
            if p is None:
                raise ValueError(f"load_weights: unknown parameter name {name!r}")
            if scale and (p.dim() != 2 or tuple(tensor.shape) != scale_shape(p.shape)):
                raise ValueError(f"load_weights: {name!r} has shape {tuple(tensor.shape)}, the 128x128 block scales "
                                 f"of a {tuple(p.shape)} weight are {scale_shape(p.shape) if p.dim() == 2 else 'none'}")
            if not scale and tuple(p.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"load_weights: {name!r} has shape {tuple(tensor.shape)}, model expects {tuple(p.shape)}"
                )
            out.append((name, p, tensor))
        return out

    def load_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> list[str]:
        """Copy HF-named tensors into the model in place (between steps; KV cache kept).

        All-or-nothing: every name and shape is checked (`check_weights`) before the first copy, so a
        rejected call leaves the model exactly as it was. A blockwise FP8 weight (float8_e4m3fn plus its
        `weight_scale_inv`, anywhere in the update) is dequantized in FP32 and loaded in the model's dtype: the
        engine computes with exactly the FP8 weights an FP8 server holds (weights only: activations stay in the
        model dtype). Returns the names loaded.
        """
        from scalerl_mega.quant.fp8 import dequantize_named

        torch = self._torch
        resolved = self.check_weights(dequantize_named(named_tensors))
        head = self.model.get_output_embeddings().weight
        head32 = None
        with torch.no_grad():
            for _, p, tensor in resolved:
                p.copy_(tensor.to(device=p.device, dtype=p.dtype))
                if p is head and self.config.fp32_lm_head:
                    head32 = tensor.detach().to(device=p.device, dtype=torch.float32, copy=True)
        self._refresh_head(head32)
        return [name for name, _, _ in resolved]

    def set_version(self, version: int) -> None:
        self.version = int(version)

    def load_adapter(self, config: dict[str, object], named_tensors: Iterable[tuple[str, "torch.Tensor"]], *,
                     version: int) -> "LoraAdapter":
        """Serve the PEFT LoRA adapter `policy-v{version}` (`lora.parse_adapter`: checked whole, ValueError
        naming the adapter and tensor, nothing changed) to requests admitted from now on; requests already
        admitted keep theirs, and versions no request holds any more are dropped. Returns the `LoraAdapter`."""
        from scalerl_mega.rollout.lora import MultiLoRA, parse_adapter

        adapter = parse_adapter(config, named_tensors, self.model, version=version)
        if self.lora is None:
            self.lora = MultiLoRA(self.model)
        self.lora.add(adapter)
        self.adapter = adapter.name
        self.set_version(version)
        self._retain_adapters()
        return adapter

    def _retain_adapters(self) -> None:
        if self.lora is not None:
            self.lora.retain({self.adapter} | {r.adapter for r in self.rows} | {r.adapter for r in self.waiting})

    def abort_all(self) -> list[Completion]:
        """Abort every running and waiting request; return their partial outputs (finish ABORT)."""
        rows = self.rows + list(self.waiting)
        self.rows = []
        self.waiting.clear()
        self.kv.length = 0
        self._retain_adapters()
        return [self._completion(r, FinishReason.ABORT) for r in rows]

    def retract_all(self) -> int:
        """Move running requests back to the front of the queue; their KV is dropped and
        recomputed (with the weights current at re-admission). Returns how many."""
        rows = self.rows
        self.rows = []
        self.kv.length = 0
        self.waiting.extendleft(reversed(rows))
        return len(rows)

    # ---- internals -----------------------------------------------------------------------------
    def _refresh_head(self, w32: "torch.Tensor | None" = None) -> None:
        """FP32 head weights: `w32` (the synced tensor in FP32) or the model's head upcast."""
        if not self.config.fp32_lm_head:
            self._w32 = None
        elif w32 is not None:
            self._w32 = w32
        else:
            self._w32 = self.model.get_output_embeddings().weight.detach().float()

    def _logits(self, hidden_NH: "torch.Tensor") -> "torch.Tensor":
        """[N, V] logits of the last position's hidden state: FP32 with the FP32 head, else in the
        model dtype (bf16 head: no upcast before the log-softmax)."""
        if self._w32 is not None:
            return hidden_NH.float() @ self._w32.T
        w = self.model.get_output_embeddings().weight
        return hidden_NH @ w.T

    def _forward(self, ids, mask, pos, cache):
        if self._routers:
            self._route_buf = []
        out = self.model.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
        )
        return out.last_hidden_state[:, -1]

    def _decode(self) -> "torch.Tensor":
        torch = self._torch
        kv = self.kv
        n = len(self.rows)
        if kv.length + 1 > kv.capacity:
            width = kv.length - min(kv.start_S[:n])
            kv.relayout(n_active=n, new_length=width)
        # attend over the used columns only: every column left of the oldest row's first token is
        # masked for all rows (up to half the cache between relayouts)
        off = min(kv.start_S[:n])
        cache = kv.hf_cache(slice(0, n), column_offset=off)
        kv.mask_SC[:n, kv.length] = True
        ids = torch.tensor([r.next_input for r in self.rows], dtype=torch.long, device=self.device).view(n, 1)
        pos = torch.tensor([r.pos for r in self.rows], dtype=torch.long, device=self.device).view(n, 1)
        if self.lora is not None:  # each row's adapter (rollout/lora.py)
            self.lora.bind([r.adapter for r in self.rows], device=self.device)
        hidden = self._forward(ids, self._decode_masks(off, pos), pos, cache)
        kv.length += 1
        routes = self._take_routes(n, 1)
        for i, r in enumerate(self.rows):
            r.pos += 1
            if routes is not None:
                self._add_routes(r, routes, i, 0)
        return self._logits(hidden)

    def _decode_masks(self, off: int, pos_N1: "torch.Tensor"):
        """The decode step's attention masks over cache columns `[off, length]`, built here instead of
        by HF on every call. SDPA takes a 4-D boolean mask (True = attend); a model with chunked
        attention layers (Llama-4's RoPE layers) gets `{layer type: mask}`, the chunked one keeping a
        column only where its position (column - row start) is in the query's chunk (HF's chunked
        mask with the row's left padding; a plain 4-D mask where no request outgrows the chunk, which
        both of Llama-4's mask builders pass through); a hybrid's GDN layers (Qwen3.5, Qwen3-Next) get
        None, as from HF for one new token. Other attention implementations and other layer types (sliding
        windows) get the 2-D mask, from which HF builds theirs."""
        torch = self._torch
        kv = self.kv
        n = pos_N1.shape[0]
        mask_NC = kv.mask_SC[:n, off : kv.length + 1]
        if not self._own_masks:
            return mask_NC
        full = mask_NC[:, None, None, :]
        if self._chunk is None:  # a GDN layer's decode step has no padding to mask (HF passes it None too)
            return {"full_attention": full, "linear_attention": None} if self._linear else full
        start_N1 = torch.tensor(kv.start_S[:n], dtype=torch.long, device=self.device).view(n, 1)
        col_pos_NC = torch.arange(off, kv.length + 1, device=self.device).view(1, -1) - start_N1
        same_NC = torch.div(col_pos_NC, self._chunk, rounding_mode="floor") == torch.div(
            pos_N1, self._chunk, rounding_mode="floor")
        chunked = (mask_NC & same_NC)[:, None, None, :]
        return {"full_attention": full, "chunked_attention": chunked}

    def _prefill(self, new: list[_Row]) -> "torch.Tensor":
        """Admit `new` after the running rows (one left-padded forward); their logits in the order of `self.rows`.
        With `share_prefill` the forward runs on the distinct inputs (prompt + output kept over a retraction)
        only, listed first; each copy gets its source's KV row and logits. Sampling stays per request."""
        torch = self._torch
        kv = self.kv
        n0 = len(self.rows)
        seqs = [r.req.prompt_ids + r.output_ids for r in new]
        src_of = list(range(len(new)))  # row j is a copy of distinct row src_of[j] (itself if distinct)
        if self.config.share_prefill:
            first: dict[tuple, int] = {}  # (adapter, input) -> its index among the distinct ones
            distinct, copies = [], []
            for j, s in enumerate(seqs):
                key = (new[j].adapter, *s)
                if key in first:
                    copies.append((j, first[key]))
                else:
                    first[key] = len(distinct)
                    distinct.append(j)
            order = distinct + [j for j, _ in copies]
            src_of = list(range(len(distinct))) + [d for _, d in copies]
            new, seqs = [new[j] for j in order], [seqs[j] for j in order]
        u = max(src_of) + 1  # rows computed by the forward: new[:u]
        self._stats["prefill_tokens"] += sum(len(s) for s in seqs[:u])
        p_max = max(len(s) for s in seqs)
        if n0 == 0:
            kv.length = p_max
        elif p_max > kv.length or kv.length + 1 > kv.capacity:
            width = kv.length - min(kv.start_S[:n0])
            kv.relayout(n_active=n0, new_length=max(width, p_max))
        ids = torch.zeros((u, p_max), dtype=torch.long)
        amask = torch.zeros((u, p_max), dtype=torch.bool)
        for i, s in enumerate(seqs[:u]):
            ids[i, p_max - len(s) :] = torch.tensor(s, dtype=torch.long)
            amask[i, p_max - len(s) :] = True
        pos = (amask.long().cumsum(-1) - 1).clamp(min=0)
        ids, amask, pos = ids.to(self.device), amask.to(self.device), pos.to(self.device)
        col0 = kv.length - p_max
        cache = kv.hf_cache(slice(n0, n0 + u), column_offset=col0, length=0)
        if self.lora is not None:
            self.lora.bind([r.adapter for r in new[:u]], device=self.device)
        hidden = self._forward(ids, amask, pos, cache)
        routes = self._take_routes(u, p_max)
        now = time.monotonic()
        for i, (r, s) in enumerate(zip(new, seqs)):
            if routes is not None:
                # positions recorded before a retraction keep the route that sampled their next token
                self._add_routes(r, routes, src_of[i], p_max - len(s) + r.routes_n)
            if i < u:
                kv.clear_row_prefix(n0 + i, kv.length - len(s))
            else:
                kv.move_row(n0 + src_of[i], n0 + i)  # a copy: the source's KV, mask and start
            r.pos = len(s)
            if r.t_admit is None:
                r.t_admit = now
            self.rows.append(r)
        if u < len(new):
            hidden = hidden.index_select(0, torch.tensor(src_of, dtype=torch.long, device=hidden.device))
        return self._logits(hidden)

    def _consume(self, idx: list[int], logits_NV: "torch.Tensor") -> list[Completion]:
        """Sample (or force) one token for rows `idx`; retire finished rows."""
        from scalerl_mega.rollout.sampling import sample_tokens

        torch = self._torch
        rows = [self.rows[i] for i in idx]
        sp = [r.req.sampling for r in rows]
        tokens, logps = sample_tokens(
            logits_NV,
            temperature_N=torch.tensor([s.temperature for s in sp], dtype=torch.float32, device=self.device),
            top_p_N=torch.tensor([s.top_p for s in sp], dtype=torch.float32, device=self.device),
            seeds_N=torch.tensor([r.req.seed for r in rows], dtype=torch.long, device=self.device),
            steps_N=torch.tensor([len(r.output_ids) for r in rows], dtype=torch.long, device=self.device),
        )
        tokens_l, logps_l = tokens.tolist(), logps.tolist()
        finished: list[tuple[int, FinishReason]] = []
        for j, (i, r) in enumerate(zip(idx, rows)):
            if r.forced:
                tok, lp, m = r.forced.popleft(), 0.0, 0
            else:
                tok, lp, m = tokens_l[j], logps_l[j], 1
                r.n_sampled += 1
            r.output_ids.append(tok)
            r.logprobs.append(lp)
            r.versions.append(self.version if self.lora is None else r.bound_version)
            r.loss_mask.append(m)
            r.next_input = tok
            reason = self._finish_reason(r, tok, sampled=m == 1)
            if reason is not None:
                finished.append((i, reason))
        out = []
        for i, reason in sorted(finished, key=lambda x: -x[0]):
            out.append(self._completion(self.rows[i], reason))
            last = len(self.rows) - 1
            if i != last:
                self.kv.move_row(last, i)
                self.rows[i] = self.rows[last]
            self.rows.pop()
        if not self.rows:
            self.kv.length = 0
        if out:
            self._retain_adapters()
        out.reverse()
        return out

    def _finish_reason(self, r: _Row, tok: int, *, sampled: bool) -> FinishReason | None:
        sp = r.req.sampling
        ended = None
        if sampled and tok in r.stop_ids:
            ended = FinishReason.STOP
        elif (
            sampled
            and sp.interruption_at is not None
            and r.interrupted_at is None
            and r.n_sampled >= sp.interruption_at
        ):
            r.interrupted_at = len(r.output_ids)
            r.forced.extend(sp.interruption_ids)
            r.limit = len(r.output_ids) + len(sp.interruption_ids) + sp.answer_budget
        if ended is None and not r.forced and len(r.output_ids) >= r.limit:
            ended = FinishReason.LENGTH
        if ended == FinishReason.STOP and r.interrupted_at is not None:
            return FinishReason.INTERRUPTED  # answered within the answer budget; out of it: LENGTH
        return ended

    def _completion(self, r: _Row, reason: FinishReason) -> Completion:
        now = time.monotonic()
        admit = r.t_admit if r.t_admit is not None else now
        return Completion(
            prompt_id=r.req.prompt_id,
            sample_index=r.req.sample_index,
            prompt_ids=list(r.req.prompt_ids),
            output_ids=list(r.output_ids),
            gen_logprobs=list(r.logprobs),
            weight_versions=list(r.versions),
            finish_reason=reason,
            loss_mask=list(r.loss_mask),
            interrupted_at=r.interrupted_at,
            submitted_version=r.req.submitted_version,
            timings={"queue_s": admit - r.t_submit, "generate_s": now - admit},
            routes=self._routes(r),
        )


def _kv_shape(mcfg, *, heads: int, head_dim: int) -> dict[str, int]:
    """What one token's cache entry holds per layer: K and V heads; DeepSeek-V3's MLA (transformers caches its
    latents) one compressed KV of `kv_lora_rank` and one RoPE key of `qk_rope_head_dim`."""
    if getattr(mcfg, "kv_lora_rank", None):
        return dict(num_kv_heads=1, head_dim=mcfg.kv_lora_rank, value_head_dim=mcfg.qk_rope_head_dim)
    return dict(num_kv_heads=getattr(mcfg, "num_key_value_heads", None) or heads, head_dim=head_dim)
