"""The one way a `scalerl-train` config is made: compose `conf/` with overrides (Hydra), turn the node into
the typed TrainConfig tree, prepare it and validate it. `scalerl-train` (through `@hydra.main`, then
`from_node`), `--validate`, the engine server (`scalerl_mega.serve`), the Slurm launch check
(`cluster.launch_config`) and the benches all go through here.

Preparation (`prepare`) is everything that can be checked or derived before a process group, model or
engine exists:

    model     model=hf -> the checkpoint's shapes; an explicit preset is checked against init_from_hf
    data      column keys / template; every data file exists and every row loads (data/columns.py: the first
              bad row or missing column, `file:line`); data.val_prompts leaves prompts to train on; a dataset
              run has a tokenizer (config/machine.py); the synthetic task's vocabulary fits the model
    reward    the reward group, incl. that a custom `_target_` imports and is callable
    metrics   optional trackers (metrics.loggers) are known and installed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scalerl_mega.conf_path import conf_dir

if TYPE_CHECKING:  # pragma: no cover
    from omegaconf import DictConfig

    from scalerl_mega.config import TrainConfig

CONFIG_NAME = "train"


def prepare(config: TrainConfig) -> TrainConfig:
    """`config` with `model=hf` resolved; ValueError naming the key on any problem."""
    from scalerl_mega.config import check_tokenizer_source
    from scalerl_mega.data.columns import check_data_files, check_data_keys, check_data_rows
    from scalerl_mega.data.tasks.tokenizer import check_synthetic_vocab
    from scalerl_mega.metrics.loggers import check_loggers
    from scalerl_mega.model.hf_import import resolve_model
    from scalerl_mega.rewards.custom import check_reward_settings

    resolve_model(config)
    check_data_keys(config.data)
    if config.data.name == "synthetic":
        check_synthetic_vocab(vocab_size=int(config.model.vocab_size),
                              interruption_phrase=config.length.interruption_phrase)
    elif not getattr(config, "dry_run", False):  # a dry run builds the layout only: no data is read
        check_data_files(config.data)
        check_tokenizer_source(config)
        distinct = check_data_rows(config.data)
        check_sft_examples(config, distinct=distinct)
    check_reward_settings(config.reward)
    check_loggers(config.metrics)
    return config


def check_sft_examples(config: TrainConfig, *, distinct: int) -> None:
    """A dataset run's warm start draws batches of `sft.batch_size` from its training prompts: at most the
    `distinct` prompts less the held-out ones (`data.split.held_out_size`; prompts over `data.max_prompt_tokens`,
    dropped at the start, can only make it fewer)."""
    from scalerl_mega.data.split import MAX_HELD_OUT_FRACTION, held_out_size

    if not config.sft.steps:
        return
    n_train = distinct - held_out_size(distinct, num_val=int(config.data.val_prompts),
                                        max_fraction=MAX_HELD_OUT_FRACTION)
    if config.sft.batch_size > n_train:
        raise ValueError(f"sft.batch_size={config.sft.batch_size} exceeds the {n_train} SFT examples (the dataset's "
                         f"{distinct} distinct prompts less the held-out ones)")


def from_node(node: DictConfig, *, preflight: bool = True, machine: bool = True) -> TrainConfig:
    """A composed OmegaConf node -> the validated TrainConfig: `prepare` (with `preflight`), the checks of
    every group (`config.validate`), and this machine's (`config.validate_machine`, with `machine`)."""
    from omegaconf import OmegaConf

    from scalerl_mega.config import validate, validate_machine

    config = OmegaConf.to_object(node)
    if preflight:
        prepare(config)
    validate(config)
    if machine:
        validate_machine(config)
    return config


def compose_node(overrides: list[str]) -> DictConfig:
    """Hydra's composition of `conf/train.yaml` with `overrides` outside `@hydra.main` (`hydra.*` overrides,
    which only a launch can apply, are dropped; `output_dir` defaults to `.`, since it otherwise
    interpolates Hydra's run directory). Raises Hydra's / OmegaConf's errors for a bad override."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from scalerl_mega.config import register_configs

    register_configs()
    from scalerl_mega.model.tiny_run import with_recorded

    overrides, _ = with_recorded(overrides)  # a tiny checkpoint's own settings, as `scalerl-train` adds them
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    if not any(o.startswith("output_dir=") for o in kept):
        kept.append("output_dir=.")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return compose(config_name=CONFIG_NAME, overrides=kept)
    finally:
        GlobalHydra.instance().clear()


def run_dir_of(overrides: list[str]) -> str:
    """The folder the run of `scalerl-train OVERRIDES` writes to: `output_dir=`, else `hydra.run.dir=` (as given),
    else conf/train.yaml's `hydra.run.dir` (`outputs/<run_name>/seed<seed>`) for these overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from scalerl_mega.config import register_configs
    from scalerl_mega.config.output_dir import RUN_DIR_KEY, override_value

    for key in ("output_dir", RUN_DIR_KEY):
        given = override_value(overrides, key)
        if given is not None:
            return given
    register_configs()
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            node = compose(config_name=CONFIG_NAME, overrides=kept, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    return str(OmegaConf.select(node, RUN_DIR_KEY))


def compose_run_node(overrides: list[str]) -> DictConfig:
    """`compose_node` for the run of `scalerl-train OVERRIDES` as it would be launched: its `output_dir` is the
    run's folder (`run_dir_of`), not '.', so that `--validate` checks the run directory the run would use."""
    from scalerl_mega.config.output_dir import override_value

    if override_value(overrides, "output_dir") is None:
        overrides = [*overrides, f"output_dir={run_dir_of(overrides)}"]
    return compose_node(overrides)


def compose(overrides: list[str], *, preflight: bool = True, machine: bool = False) -> TrainConfig:
    """The validated TrainConfig of `scalerl-train OVERRIDES` (`compose_node`, then `from_node`)."""
    return from_node(compose_node(overrides), preflight=preflight, machine=machine)
