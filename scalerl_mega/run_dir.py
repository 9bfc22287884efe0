"""Safe run management for `scalerl-train`: one run directory holds one run's config.

A run writes its resolved config to `<output_dir>/run_config.yaml`. Launched again in the same
directory with a checkpoint there (`resume=auto`), the new config is compared with the saved one;
if a key that changes the run's math differs (loss, model, data, ...), the launch is refused (exit
code 2) with every differing key listed, because resuming would silently continue the old run's
checkpoint under the new settings. `resume=force` resumes anyway (and records the new config).
Keys that may change between launches of one run are `RESUMABLE` (e.g. `train.steps` to extend it).

Config errors (this and every compose-time check, scalerl_mega/compose.py) print one line,
`config error: <key>=<value>: <rule>`, and exit with code 2, without a traceback;
`scalerl-train --validate ...` runs all of them and exits without training.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from scalerl_mega.config import TrainConfig, flat_config

SAVED = "run_config.yaml"
EXIT_CONFIG_ERROR = 2

RESUMABLE = (
    "resume", "output_dir", "run_name", "train.steps", "train.val_every", "train.save_every",
    "train.keep_checkpoints", "train.poll_timeout_s", "metrics.", "forecast.", "rollout.engine_urls",
    "rollout.sync_master_address", "rollout.startup_timeout_s", "rollout.sglang_host", "rollout.sglang_port",
    "rollout.engine_threads", "rollout.engine_nice", "rollout.weight_sync_flattened", "cluster.partition",
    "cluster.account", "cluster.time_min", "cluster.cpus_per_task", "cluster.mem_gb", "cluster.trainer_threads",
    "sft.checkpoint", "sft.any_seed", "sft.synthetic_num_prompts",
)
"""Keys (or `group.` prefixes) that may differ when a run is resumed (`sft.checkpoint`, `sft.any_seed` and
`sft.synthetic_num_prompts` only concern the warm start, which a resumed run skips)."""


def _resumable(key: str) -> bool:
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE)


def config_differences(saved: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: saved -> new` for every non-resumable key whose value differs (or exists in one only)."""
    missing = object()
    out = []
    for key in sorted(set(saved) | set(new)):
        a, b = saved.get(key, missing), new.get(key, missing)
        if a != b and not _resumable(key):
            show = lambda v: "(absent)" if v is missing else repr(v)  # noqa: E731
            out.append(f"{key}: {show(a)} -> {show(b)}")
    return out


def load_saved(run_dir: Path) -> dict[str, Any] | None:
    from omegaconf import OmegaConf

    path = run_dir / SAVED
    if not path.is_file():
        return None
    return flat_config(OmegaConf.to_container(OmegaConf.load(path), resolve=False))


def write_config(config: TrainConfig, run_dir: Path) -> Path:
    """`run_dir/run_config.yaml` (atomic: several ranks may write the same content)."""
    from omegaconf import OmegaConf

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SAVED
    tmp = run_dir / f".{SAVED}.{os.getpid()}"
    tmp.write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
    os.replace(tmp, path)
    return path


def check_resume(config: TrainConfig, *, write: bool = True) -> list[str]:
    """Refuse (ValueError) resuming `config.output_dir`'s checkpoint under a different config;
    `resume=force` turns the refusal into the returned list of differences. `resume=force` becomes
    `auto` for the loop. With `write`, records `config` as the run's config."""
    from scalerl_mega.loop import latest_checkpoint

    force = str(config.resume) == "force"
    if force:
        config.resume = "auto"
    run_dir = Path(config.output_dir)
    diffs: list[str] = []
    saved = load_saved(run_dir)
    if saved is not None and str(config.resume) == "auto" and latest_checkpoint(config) is not None:
        diffs = config_differences(saved, flat_config(config))
        if diffs and not force:
            raise ValueError(f"resume=auto: {run_dir} holds a checkpoint of a run whose config differs in "
                             f"{len(diffs)} key(s): " + "; ".join(diffs)
                             + " (use another run_name= (runs go to outputs/<run_name>/seed<seed>) or output_dir=, "
                             "resume=never to start over, or resume=force)")
    if write:
        write_config(config, run_dir)
    return diffs


def _one_line(exc: BaseException) -> str:
    """An exception (and its causes) as one line, without OmegaConf's key/type trailer or Hydra's
    search path."""
    parts: list[str] = []
    while exc is not None:
        for ln in str(exc).splitlines():
            ln = ln.strip().rstrip(":")
            if ln.startswith("Config search path"):
                break
            if ln and not ln.startswith(("full_key:", "reference_type=", "object_type=", "Set the env")) \
                    and ln not in parts:
                parts.append(ln)
        exc = exc.__cause__
    return "; ".join(parts).replace(".;", ";") or "invalid configuration"


def config_error_exit(exc: BaseException) -> NoReturn:
    """`config error: <one line>` on stderr, exit status 2 (SystemExit: the caller's `finally` blocks run)."""
    print(f"config error: {_one_line(exc)}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CONFIG_ERROR)


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """Around a run's set-up (building the task, trainer, engines; the warm start's checks): a ValueError there is
    a configuration the compose-time checks could not see (it needs the built objects), reported like theirs."""
    try:
        yield
    except ValueError as exc:
        config_error_exit(exc)


TRAIN_FLAGS = ("--validate",)
"""`scalerl-train`'s own flags (Hydra's are its argument parser's)."""


def argv_problem(argv: list[str]) -> str | None:
    """The first misspelled name of a `scalerl-train` command line, with the closest valid one: an unknown flag,
    config key, group or group option (config/keys.py); None when every name is known."""
    from hydra._internal.utils import get_args_parser

    from scalerl_mega.config.keys import override_problem
    from scalerl_mega.suggest import did_you_mean

    flags = [*TRAIN_FLAGS, *get_args_parser()._option_string_actions]
    for a in argv:
        if a.startswith("-"):
            flag = a.split("=", 1)[0]
            if flag not in flags:
                key = flag.lstrip("-").replace("-", "_")
                if override_problem(f"{key}=1") is None:  # a config key written as a flag: --dry-run
                    return f"unknown option {flag}: {key} is a config key, written {key}=<value> (e.g. {key}=true)"
                return f"unknown option {flag}{did_you_mean(flag, flags)}"
        else:
            problem = override_problem(a)
            if problem:
                return problem
    return None


def precheck_overrides(argv: list[str]) -> None:
    """Compose `conf/train.yaml` with the command line's overrides as Hydra will, so that a bad
    override (unknown key, wrong type, missing group option) is one `config error:` line with exit
    code 2 instead of Hydra's multi-line report; a misspelled name first gets the closest valid one
    (`argv_problem`). Composing is skipped when the command line has flags (`--cfg`, `-m`, `--help`, ...:
    Hydra handles those); `hydra.*` overrides are Hydra's own."""
    problem = argv_problem(argv)
    if problem:
        config_error_exit(ValueError(problem))
    argv = [a for a in argv if a not in TRAIN_FLAGS]
    if any(a.startswith("-") for a in argv):
        return
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from scalerl_mega.compose import compose_node

    try:
        compose_node(argv)
    except (HydraException, OmegaConfBaseException) as exc:
        config_error_exit(exc)


def config_or_exit(cfg: TrainConfig, *, validate_only: bool = False) -> TrainConfig:
    """`scalerl-train`'s front door: the validated TrainConfig with the run directory checked (and, unless
    `validate_only`, recorded there and announced), or a one-line `config error: ...` on stderr and exit code 2
    (no traceback). `--validate` then runs the run's start checks (train.validate_or_exit)."""
    import logging

    from scalerl_mega.compose import from_node

    try:
        config = from_node(cfg)
        diffs = check_resume(config, write=not validate_only)
    except ValueError as exc:
        config_error_exit(exc)
    log = logging.getLogger("scalerl_mega.run_dir")
    if diffs:
        log.warning("resume=force: resuming under a config that differs in %s", "; ".join(diffs))
    if not validate_only and not config.dry_run and os.environ.get("RANK", "0") == "0":
        print(start_banner(config), flush=True)  # before the heavy imports: the first line comes in seconds
    return config


def config_ok_line(config: TrainConfig) -> str:
    """What `scalerl-train --validate` prints when every check passed."""
    n = config.model.num_params()
    return (f"config OK: model {model_label(config)} ({n['total'] / 1e6:.1f}M parameters), data={data_label(config)}, "
            f"loss={config.loss.name}, reward={config.reward.name}, output_dir={config.output_dir}")


def start_banner(config: TrainConfig) -> str:
    """The lines `scalerl-train` prints first: where the run writes, its recipe, model and schedule, and whether it
    resumes (what a user would otherwise wait a minute to learn from the first progress line)."""
    from scalerl_mega.loop import latest_checkpoint
    from scalerl_mega.trainer.megatron.checkpoint import latest_step, loadable_step

    m, t = config.model, config.train
    n = m.num_params()
    from scalerl_mega.model.hybrid import banner_note

    moe = f", MoE {m.num_experts} experts top-{m.moe_topk}" if m.is_moe else ""
    moe += banner_note(m, cuda=str(config.cluster.device).startswith("cuda"))
    ckpt = latest_checkpoint(config)
    if ckpt is not None:  # the step the load will take (a damaged newest checkpoint falls back), not `latest`'s
        step, newest = loadable_step(ckpt), latest_step(ckpt)
        damaged = f" (the newest checkpoint, step {newest}, is damaged)" if newest not in (None, step) else ""
        start = (f"resuming at step {step}{damaged} of" if step is not None else
                 f"resuming from {ckpt}, where no checkpoint verifies (the load names each), then")
    else:
        start = f"{config.sft.steps} SFT warm-start steps, then" if config.sft.steps else "fresh run:"
    val = (f"; validation every {t.val_every} steps on {config.data.val_prompts} held-out prompts x "
           f"{config.data.val_samples}" if t.val_every else "; no validation")
    op = config.off_policy
    recipe = " ".join([f"loss={config.loss.name}", f"aggregation={config.aggregation.name}",
                       f"adv_norm={config.adv_norm.name}", f"off_policy={op.name}(k={op.k})",
                       f"length={config.length.name}", f"curriculum={config.curriculum.name}",
                       f"filter={config.filter.name}", f"precision={config.precision.name}"])
    return "\n".join([
        f"scalerl-train: run '{config.run_name}' (seed {config.seed}) -> {config.output_dir} "
        "(report.md there at the end)",
        f"  recipe  {recipe}",
        f"  model   {model_label(config)}: {_count(n['total'])} parameters ({m.num_layers} layers, hidden {m.hidden_size}{moe}); "
        f"data={data_label(config)}, reward={config.reward.name}; {config.cluster.device}, rollout={config.rollout.name}",
        f"  steps   {start} {t.steps} RL steps x {t.prompts_per_step} prompts x {t.generations_per_prompt} "
        f"samples{val}",
        *env_banner(config),
    ])


def env_banner(config: TrainConfig) -> list[str]:
    """The banner's episode line (none for `env=single`): the environment (its group, class or agent function
    and keyword arguments), the turns and ids an episode may hold, the chat template."""
    from scalerl_mega.config.env import episode_budget

    env = config.env
    if env.name == "single":
        return []
    node = (env.custom if env.name == "custom" else env.agent) or {}
    target = node.get("_target_", "") if hasattr(node, "get") else ""
    kwargs = dict(node.get("kwargs") or {}) if env.name == "custom" and hasattr(node, "get") else {}
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
    budget = episode_budget(env, max_new_tokens=config.length.max_new_tokens)
    template = env.chat_template or "the tokenizer's"
    return [f"  env     {env.name}: {target}({args}); at most {env.max_turns} turns and {budget} ids per episode, "
            f"chat template {template}"]


def model_label(config: TrainConfig) -> str:
    """The model by its own name: the preset's (`'tiny_qwen3'`), or for `model=hf` the checkpoint's: its directory
    name and config.json's `model_type` (`'Qwen3-8B' (model=hf, qwen3, from /ckpt/Qwen3-8B)`), not 'hf'."""
    from scalerl_mega.model.hf_import import HF_MODEL_NAME, hf_text_config, read_hf_config

    if config.model.name != HF_MODEL_NAME or not config.init_from_hf:
        return f"'{config.model.name}'"
    path = Path(config.init_from_hf)
    try:
        kind = f", {hf_text_config(read_hf_config(path)).get('model_type', 'no model_type')}"
    except ValueError:  # the banner names what it can: the load reports an unreadable config.json
        kind = ""
    return f"'{path.resolve().name}' (model=hf{kind}, from {config.init_from_hf})"


def data_label(config: TrainConfig) -> str:
    """The data group, with the user's files when it reads some (`data=polaris` alone read as Polaris-53K)."""
    files = [*config.data.train_files, *config.data.code_files] if config.data.name != "synthetic" else []
    if not files:
        return str(config.data.name)
    more = f" + {len(files) - 1} more" if len(files) > 1 else ""
    return f"{config.data.name} ({Path(files[0]).name}{more})"


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
