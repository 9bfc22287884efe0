"""LoRA adapters served by the local engine on its own HF model, several versions at once.

An adapter arrives in PEFT 0.21's interchange format (what `adapter_config.json` and
`adapter_model.safetensors` hold): a config dict (`peft_type` LORA, `r`, `lora_alpha`, `target_modules`) and
tensors `base_model.model.<module>.lora_A.weight` [r, in] and `.lora_B.weight` [out, r]. `parse_adapter`
checks it whole against the model (names, shapes, every targeted linear present, no unsupported option) before
anything changes, so a failed load leaves the engine serving what it served.

The model itself is untouched (its parameters, names and digest stay the base model's): `MultiLoRA` adds a
forward hook to each adapted `nn.Linear` that adds `(x A^T B^T) * alpha / r` (PEFT's `lora.Linear.forward`
in eval mode, the same order of operations) for the rows of the batch bound to an adapter. Rows of one batch may
be bound to different versions: a request keeps the adapter it was admitted with (PipelineRL's in-flight
semantics per request, as SGLang binds a request to its `lora_path`), and a version is dropped once no
request holds it (`MultiLoRA.retain`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

ADAPTER_PREFIX = "policy-v"
PEFT_PREFIX = "base_model.model."
_EXPERT = re.compile(r"^(.+\.experts)\.\d+\.(?:gate_proj|up_proj|down_proj)$")
"""A routed expert's projection: group 1 is the fused experts module's name."""
_TENSOR = re.compile(r"^base_model\.model\.(?P<module>.+)\.(?P<which>lora_A|lora_B)\.weight$")
_UNSUPPORTED = {
    "use_dora": "DoRA", "use_rslora": "rsLoRA scaling (SGLang ignores it)", "rank_pattern": "per-module ranks",
    "alpha_pattern": "per-module alphas", "layers_to_transform": "a layer subset", "exclude_modules": "excluded modules",
    "modules_to_save": "fully trained modules", "target_parameters": "adapters on parameters (fused MoE experts)",
}
"""PEFT config keys whose non-default value this engine does not apply (refused, naming the key)."""


def adapter_name(version: int) -> str:
    """The served name of the adapter trained up to step `version` (`policy-v{N}`)."""
    return f"{ADAPTER_PREFIX}{int(version)}"


@dataclass(kw_only=True)
class LoraAdapter:
    """One adapter version, resolved against a model: module name -> (A [r, in], B [out, r])."""

    name: str
    version: int
    scale: float
    """`lora_alpha / r` (PEFT's scaling without rsLoRA)."""
    modules: dict[str, tuple["torch.Tensor", "torch.Tensor"]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ab in self.modules.values() for t in ab)


def _targets(config: dict[str, object], *, name: str) -> tuple[int, float, "str | list[str]"]:
    """(r, alpha, target_modules) of a PEFT LoRA config dict; ValueError naming the adapter and the key."""
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise ValueError(f"adapter {name!r}: peft_type={config.get('peft_type')!r}, only 'LORA' is served")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise ValueError(f"adapter {name!r}: {key}={config[key]!r} ({what}) is not supported")
    r, alpha, targets = config.get("r"), config.get("lora_alpha"), config.get("target_modules")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"adapter {name!r}: r={r!r} must be an integer >= 1")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"adapter {name!r}: lora_alpha={alpha!r} must be a number")
    if not targets or not isinstance(targets, (str, list, tuple, set)):
        raise ValueError(f"adapter {name!r}: target_modules={targets!r} must be a regex or a list of module names")
    return r, float(alpha), targets


def _is_target(key: str, targets: "str | list[str]") -> bool:
    """PEFT's rule: a string is a full-match regex on the module name, a list matches the name or its last parts."""
    if isinstance(targets, str):
        return re.fullmatch(targets, key) is not None
    return key in targets or any(key.endswith("." + t) for t in targets)


def check_adapter(config: dict[str, object], named_tensors: Iterable[tuple[str, "torch.Tensor"]],
                  linears: dict[str, tuple[int, int]], *, version: int, where: str = "the engine's model"
                  ) -> tuple[float, dict[str, dict[str, "torch.Tensor"]]]:
    """Check a PEFT adapter against the shapes [out, in] of the linears it may adapt (`linears`, by module name):
    (alpha / r, module -> {"lora_A": A, "lora_B": B}). ValueError names the adapter and the first offending
    tensor: an unknown or untargeted module, a wrong shape, a duplicate, or a targeted linear without its A or B."""
    name = adapter_name(version)
    r, alpha, targets = _targets(config, name=name)
    got: dict[str, dict[str, torch.Tensor]] = {}
    for tname, t in named_tensors:
        m = _TENSOR.match(tname)
        if m is None:
            raise ValueError(f"adapter {name!r}: tensor {tname!r} is not named "
                             f"'{PEFT_PREFIX}<module>.lora_A.weight' or '.lora_B.weight'")
        mod_name, which = m["module"], m["which"]
        if mod_name not in linears:
            raise ValueError(f"adapter {name!r}: tensor {tname!r}: no such linear module in {where}")
        if not _is_target(mod_name, targets):
            raise ValueError(f"adapter {name!r}: tensor {tname!r}: module not in target_modules={targets!r}")
        out_f, in_f = linears[mod_name]
        want = (r, in_f) if which == "lora_A" else (out_f, r)
        if tuple(t.shape) != want:
            raise ValueError(f"adapter {name!r}: tensor {tname!r} has shape {tuple(t.shape)}, expected {want} "
                             f"(r={r}, {mod_name} is [{out_f}, {in_f}])")
        if which in got.setdefault(mod_name, {}):
            raise ValueError(f"adapter {name!r}: tensor {tname!r} appears twice")
        got[mod_name][which] = t
    experts = any(_EXPERT.match(m) for m in got)
    for mod_name in linears:
        # routed experts' projections match the short names of the dense/shared ones; PEFT adapts them only as
        # modules, which fused experts are not: required only from an adapter that carries expert tensors
        if _is_target(mod_name, targets) and (experts or not _EXPERT.match(mod_name)):
            for which in ("lora_A", "lora_B"):
                if which not in got.get(mod_name, {}):
                    raise ValueError(f"adapter {name!r}: missing tensor '{PEFT_PREFIX}{mod_name}.{which}.weight' "
                                     f"(target_modules={targets!r} covers {mod_name})")
    if not got:
        raise ValueError(f"adapter {name!r}: target_modules={targets!r} matches no linear of {where}")
    return alpha / r, got


def model_linears(model: "torch.nn.Module") -> dict[str, tuple[int, int]]:
    """[out, in] of every `nn.Linear` of an HF model, by module name (what a LoRA adapter may target), and of each
    routed expert's projections in the Llama-4 MoE layers the engine runs sparsely (`sparse_moe.py`:
    `<layer>.feed_forward.experts.<e>.gate_proj` / `up_proj` [I, H], `down_proj` [H, I], the checkpoint's per-expert
    names; the experts are one fused parameter each in the model)."""
    import torch

    from scalerl_mega.rollout.sparse_moe import SPARSE_ATTR

    out = {n: (m.out_features, m.in_features) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    for name, m in model.named_modules():
        if getattr(m, SPARSE_ATTR, False):
            n_exp, hidden, two_i = m.experts.gate_up_proj.shape
            for e in range(n_exp):
                base = f"{name}.experts.{e}."
                out.update({base + "gate_proj": (two_i // 2, hidden), base + "up_proj": (two_i // 2, hidden),
                            base + "down_proj": (hidden, two_i // 2)})
    return out


def parse_adapter(config: dict[str, object], named_tensors: Iterable[tuple[str, "torch.Tensor"]], model: "torch.nn.Module",
                  *, version: int) -> LoraAdapter:
    """`check_adapter` against `model`'s linears, the tensors copied to the model's device and dtype."""
    scale, got = check_adapter(config, named_tensors, model_linears(model), version=version)
    param = next(model.parameters())
    modules = {k: tuple(v[w].detach().to(device=param.device, dtype=param.dtype, copy=True) for w in ("lora_A", "lora_B"))
               for k, v in got.items()}
    return LoraAdapter(name=adapter_name(version), version=int(version), scale=scale, modules=modules)


class MultiLoRA:
    """The adapters a model serves and the batch's binding of rows to them (see module doc).

    `bind(names)` sets, before a forward, which adapter each batch row uses (None: the base model); every hooked
    linear then adds each adapter's delta to its rows only."""

    def __init__(self, model: "torch.nn.Module") -> None:
        self.model = model
        self.adapters: dict[str, LoraAdapter] = {}
        self._hooked: dict[str, "torch.utils.hooks.RemovableHandle"] = {}
        self._experts: dict[str, "torch.nn.Module"] = {}
        """Sparse Llama-4 expert modules with adapters, by name (`sparse_moe_forward` calls `expert_delta`)."""
        self._groups: list[tuple[LoraAdapter, "torch.Tensor | None"]] = []
        self._rows = 1
        self._tokens: tuple[int, list] | None = None

    def add(self, adapter: LoraAdapter) -> None:
        from scalerl_mega.rollout.sparse_moe import LORA_ATTR

        modules = dict(self.model.named_modules())
        for mod_name in adapter.modules:
            experts_name = None if mod_name in modules else _EXPERT.match(mod_name)
            if experts_name is not None:  # a routed expert's projection: served by the sparse MoE forward
                self._experts[experts_name[1]] = modules[experts_name[1]]
                setattr(modules[experts_name[1]], LORA_ATTR, self)
            elif mod_name not in self._hooked:
                self._hooked[mod_name] = modules[mod_name].register_forward_hook(self._hook(mod_name))
        self.adapters[adapter.name] = adapter

    def retain(self, keep: set[str | None]) -> list[str]:
        """Drop every adapter not in `keep` (the current one and those running or waiting requests hold);
        returns the dropped names. Hooks of modules no adapter covers any more are removed."""
        dropped = [n for n in self.adapters if n not in keep]
        for n in dropped:
            del self.adapters[n]
        covered = {m for a in self.adapters.values() for m in a.modules}
        for mod_name in [m for m in self._hooked if m not in covered]:
            self._hooked.pop(mod_name).remove()
        from scalerl_mega.rollout.sparse_moe import LORA_ATTR

        covered_experts = {x[1] for x in map(_EXPERT.match, covered) if x is not None}
        for name in [n for n in self._experts if n not in covered_experts]:
            delattr(self._experts.pop(name), LORA_ATTR)
        return dropped

    def bind(self, names: list[str | None], *, device: "torch.device") -> None:
        """The next forward's rows: row i uses adapter `names[i]` (None: none)."""
        import torch

        self._groups, self._rows, self._tokens = [], len(names), None
        for n in dict.fromkeys(x for x in names if x is not None):
            rows = [i for i, x in enumerate(names) if x == n]
            idx = None if len(rows) == len(names) else torch.tensor(rows, dtype=torch.long, device=device)
            self._groups.append((self.adapters[n], idx))

    def _token_groups(self, n_tokens: int) -> list:
        """The bound groups over the forward's flattened tokens ([rows, seq] row-major): (adapter, None for all
        tokens, else a bool mask of its rows' tokens)."""
        import torch

        if self._tokens is None or self._tokens[0] != n_tokens:
            seq, groups = n_tokens // self._rows, []
            for adapter, idx in self._groups:
                member = None
                if idx is not None:
                    member = torch.zeros(n_tokens, dtype=torch.bool, device=idx.device)
                    member[(idx[:, None] * seq + torch.arange(seq, device=idx.device)).reshape(-1)] = True
                groups.append((adapter, member))
            self._tokens = (n_tokens, groups)
        return self._tokens[1]

    def expert_delta(self, experts: "torch.nn.Module", e: int, *, rows: "torch.Tensor", x: "torch.Tensor",
                     outs: tuple, projs: tuple[str, ...], n_tokens: int) -> tuple:
        """Routed expert `e`'s outputs `outs` (one per projection in `projs`, all computed from its input `x`, the
        tokens `rows` of the layer's `n_tokens`) plus each bound adapter's `(x A^T B^T) * alpha / r` on its tokens."""
        import torch.nn.functional as F

        prefix = next(n for n, m in self._experts.items() if m is experts)
        outs = list(outs)
        for adapter, member in self._token_groups(n_tokens):
            sel = None if member is None else member.index_select(0, rows).nonzero().squeeze(1)
            for k, proj in enumerate(projs):
                ab = adapter.modules.get(f"{prefix}.{e}.{proj}")
                if ab is None or (sel is not None and sel.numel() == 0):
                    continue
                if sel is None:
                    outs[k] = outs[k] + F.linear(F.linear(x, ab[0]), ab[1]) * adapter.scale
                else:
                    delta = F.linear(F.linear(x.index_select(0, sel), ab[0]), ab[1]) * adapter.scale
                    outs[k] = outs[k].index_add(0, sel, delta)
        return tuple(outs)

    def _hook(self, mod_name: str):
        import torch.nn.functional as F

        def add_delta(module, args, out):
            x = args[0]
            for adapter, idx in self._groups:
                ab = adapter.modules.get(mod_name)
                if ab is None:
                    continue
                if idx is None:
                    out = out + F.linear(F.linear(x, ab[0]), ab[1]) * adapter.scale
                else:
                    delta = F.linear(F.linear(x.index_select(0, idx), ab[0]), ab[1]) * adapter.scale
                    out = out.index_add(0, idx, delta)
            return out

        return add_delta
