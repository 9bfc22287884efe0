"""`scalerl-train --validate` performs every check the run performs before its first step: each
config below passed `--validate` ("config OK") and was refused seconds into the run with a traceback. Now
composing it (what `--validate` and the run's start both do, compose.py) raises the ValueError that becomes the
one-line `config error:`; and an error only the run's set-up can find is that same line with exit status 2.
Own data with the embedded demo model says it cannot read free text and what to set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _compose(*overrides: str):
    from scalerl_mega.compose import compose

    return compose(["experiment=demo", *overrides], machine=True)


def _rows(n: int) -> list[dict]:
    return [{"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(n)]


def _jsonl(path: Path, rows: list, *, raw_line: tuple[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    if raw_line is not None:
        lines.insert(raw_line[0] - 1, raw_line[1])
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def hf_model(tmp_path):
    """A dataset-capable setting: a real HF tokenizer (tests/unit/test_data_build.py's) and a model whose
    vocabulary holds it."""
    from test_data_build import _tokenizer_dir

    tok, n = _tokenizer_dir(tmp_path, chat=False)
    return [f"data.tokenizer_path={tok}", f"model.vocab_size={n + 8}", "data.max_prompt_tokens=64"]


def test_negative_learning_rate_is_refused_at_compose_time():
    with pytest.raises(ValueError, match=r"^optim.lr=-0.0001 must be > 0$"):
        _compose("optim.lr=-1e-4")


@pytest.mark.parametrize("raw, match", [
    ((3, '{"problem": "What is 1?", "answer": '), r"bad\.jsonl:3: bad JSON"),
    ((2, '{"problem": "no answer column"}'), r"bad\.jsonl:2: missing field 'answer'"),
])
def test_a_malformed_row_or_a_missing_column_is_refused_naming_file_and_line(tmp_path, hf_model, raw, match):
    f = _jsonl(tmp_path / "bad.jsonl", _rows(30), raw_line=raw)
    with pytest.raises(ValueError, match=rf"^data\.train_files: .*{match}"):
        _compose("data=jsonl", f"data.train_files=[{f}]", "data.val_prompts=5", *hf_model)


def test_val_prompts_must_leave_prompts_to_train_on(tmp_path, hf_model):
    f = _jsonl(tmp_path / "qa.jsonl", _rows(12) + _rows(12))  # 12 distinct prompts, each twice
    with pytest.raises(ValueError, match=r"data\.val_prompts=12 must be smaller than the dataset's 12 distinct"):
        _compose("data=jsonl", f"data.train_files=[{f}]", "data.val_prompts=12", *hf_model)
    with pytest.raises(ValueError, match=r"sft\.batch_size=64 exceeds the 10 SFT examples"):  # 12 - 2 held out
        _compose("data=jsonl", f"data.train_files=[{f}]", "data.val_prompts=5", *hf_model)
    c = _compose("data=jsonl", f"data.train_files=[{f}]", "data.val_prompts=5", "sft.batch_size=10", *hf_model)
    assert c.data.name == "jsonl"


def test_own_data_with_the_demo_model_says_it_cannot_read_free_text(tmp_path):
    f = _jsonl(tmp_path / "qa.jsonl", _rows(30))
    with pytest.raises(ValueError) as e:
        _compose("data=jsonl", f"data.train_files=[{f}]")
    msg = str(e.value)
    assert msg.startswith("data.name='jsonl' needs a tokenizer (data.tokenizer_path and init_from_hf are empty)")
    assert "a model of model.vocab_size=48 tokens cannot read free text (the embedded demo model's vocabulary is the " \
           "synthetic task's digits and symbols)" in msg
    assert "model=hf init_from_hf=/path/to/hf_checkpoint" in msg and "data.tokenizer_path=" in msg
    # a tokenizer alone is not enough: the demo model's 48 ids (model.vocab_size) cannot hold it
    from test_data_build import _tokenizer_dir

    tok, n = _tokenizer_dir(tmp_path, chat=False)
    with pytest.raises(ValueError, match=rf"model.vocab_size=48 is smaller than the tokenizer's vocabulary \({n} "
                                         r"tokens, .*cannot read free text .*; use a pretrained model"):
        _compose("data=jsonl", f"data.train_files=[{f}]", f"data.tokenizer_path={tok}")


def test_synthetic_vocabulary_checks_need_no_tokenizer_build():
    with pytest.raises(ValueError, match=r"model.vocab_size=16 is smaller than the synthetic task's vocabulary"):
        _compose("model.vocab_size=16")
    with pytest.raises(ValueError, match=r"length.interruption_phrase='</think> ~' has characters outside"):
        _compose("length.interruption_phrase='</think> ~'")


def _cli(tmp_path, *args):
    return subprocess.run([sys.executable, "-c", "from scalerl_mega.train import main; main()", *args],
                          capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})


def test_validate_refuses_what_the_run_refuses_and_a_run_time_config_error_is_the_same_line(tmp_path):
    bad = _cli(tmp_path, "--validate", "experiment=demo", "optim.lr=-1e-4", f"output_dir={tmp_path / 'a'}")
    assert bad.returncode == 2 and bad.stderr.strip() == "config error: optim.lr=-0.0001 must be > 0", bad.stderr
    # only the launched job knows its world size: found at the run's start, reported the same way
    run = _cli(tmp_path, "experiment=demo", "cluster.trainer_devices=2", f"output_dir={tmp_path / 'b'}")
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-3000:]
    assert lines[0].startswith("config error: cluster.trainer_devices=2 but this trainer job has WORLD_SIZE=1 ranks")


STOP = ("run_rl", "_run_rl", "_finish", "serve", "_finished_run", "run_and_exit")
"""Where the run's first step begins (the RL loop; a follower rank's serving loop; a finished run's early return;
the dry run, which plans and exits)."""


def _is_check(key) -> bool:
    name = key[1].rsplit(".", 1)[-1].lstrip("_")
    return name.startswith(("check_", "validate")) or name in ("check", "resolve_model")


def run_and_validate_reach():
    """(what `scalerl-train` calls before step 1, what `scalerl-train --validate` calls), from `train.main` through
    the static call graph (callgraph.py): --validate is the same entry without the run (`train.run_config`)."""
    from callgraph import reach

    main = [("scalerl_mega.train", "main")]
    return reach(main, stop=STOP), reach(main, stop=(*STOP, "run_config"))


def pre_step_checks() -> dict[str, set[str]]:
    """{check function: the checks that call it} of every module-level check (`check_*`, `validate*`,
    `resolve_model`) the run calls before its first step but the weights' load and the trainer's construction
    (`RUN_ONLY`), wherever it calls it (found from the entry by the call
    graph, not from a list of callers): a new check anywhere on the way is enumerated here without a test edit."""
    import importlib

    from callgraph import callees

    run, _ = run_and_validate_reach()
    checks = {k for k in run if _is_check(k) and "." not in k[1] and not k[1].startswith("_")
              and k[1] != "validate_or_exit" and k not in RUN_ONLY}  # --validate's entry; the run's own
    for mod, _ in checks:
        importlib.import_module(mod)  # where the check lives (the run imports it at call time)
    names = {k[1] for k in checks}
    return {name: {c[1] for c in run if _is_check(c) and any(t[1] == name for t in callees(c))} - {name}
            for name in names}


RUN_ONLY = {
    # the weights' load: reads and maps the checkpoint's tensors (its config.json is checked before: resolve_model,
    # check_model_matches_hf); a damaged tensor file is found by reading it
    **dict.fromkeys([("scalerl_mega.convert.hf_layout", "layout_of_config"), ("scalerl_mega.convert.hf_layout",
                     "read_layout"), ("scalerl_mega.convert.layout", "pad_vocab"), ("scalerl_mega.convert.layout",
                     "unpad_vocab"), ("scalerl_mega.convert.load", "HFShardReader.__init__"),
                     ("scalerl_mega.convert.load", "HFShardReader._header"), ("scalerl_mega.convert.load",
                     "load_full_tensors"), ("scalerl_mega.convert.load", "load_hf_checkpoint"),
                     ("scalerl_mega.convert.pipeline", "validate_hf"), ("scalerl_mega.convert.sharding", "tp_shard"),
                     ("scalerl_mega.convert.sharding", "_sections"), ("scalerl_mega.convert.gdn_layout", "shard_sections"),
                     ("scalerl_mega.convert.gdn_layout", "split_sections"),
                     ("scalerl_mega.convert.tables", "expected_hf_shape"),
                     ("scalerl_mega.convert.fp8_io", "Fp8DequantReader.__init__"),
                     ("scalerl_mega.convert.fp8_io", "quantize_hf_dir"), ("scalerl_mega.quant.fp8",
                     "dequantize_blockwise"), ("scalerl_mega.quant.fp8", "quantize_blockwise")],
                    "the weights' load"),
    # the warm start's episode traces: replaying an environment's reference replies through reset/step (a row
    # whose own column clashes with prompt/gold/prompt_id, a message that is not a chat message, a reference that
    # does not pass) is found while the SFT examples are built, one row at a time
    **dict.fromkeys([("scalerl_mega.episodes.demonstrations", "demonstration"), ("scalerl_mega.episodes.env",
                     "check_messages"), ("scalerl_mega.episodes.env", "task_row")],
                    "the warm start's episode traces"),
    # the trainer's construction: values the config checks refuse first (train.recompute, train.micro_batch_tokens,
    # train.follower_timeout_s: config/run.py; cluster.device=cuda without CUDA: validate_machine), or what only the
    # built Megatron model can say (a >5B model on a CPU, Llama-4 features the local spec lacks)
    **dict.fromkeys([("scalerl_mega.trainer.megatron.models", "build_model"), ("scalerl_mega.trainer.megatron.models",
                     "layer_spec"), ("scalerl_mega.trainer.megatron.models", "recompute_kwargs"),
                     ("scalerl_mega.trainer.megatron.parallel", "init_parallel"),
                     ("scalerl_mega.trainer.megatron.trainer", "MegatronPolicyTrainer.__init__"),
                     ("scalerl_mega.trainer.ranks", "ControlChannel.__init__"), ("scalerl_mega.trainer.ranks",
                     "ControllerTrainer.__init__"), ("scalerl_mega.objective.is_correction", "check_is_params"),
                     # peft=lora: the keys are checked by --validate (config/peft.py); what only the built model can
                     # say (grouped-GEMM experts, targets matching no linear) and the adapter's shape invariant
                     ("scalerl_mega.trainer.megatron.lora", "inject_lora"),
                     ("scalerl_mega.trainer.megatron.lora", "LoRAAdapter.__init__")],
                    "the trainer's construction"),
    # processes and servers: invariants of values already checked (reward.num_workers: check_reward_settings; the
    # engine configs: check_engine_settings), or what a started process / server / this process's limits say
    **dict.fromkeys([("scalerl_mega.preemption", "watch_parent"), ("scalerl_mega.rewards.pool", "RewardPool.__init__"),
                     ("scalerl_mega.rollout.kv_cache", "SlotKVCache.__init__"), ("scalerl_mega.rollout.local",
                     "LocalRolloutEngine._wait_for"), ("scalerl_mega.rollout.sglang.async_client",
                     "AsyncGenerateClient.__init__"), ("scalerl_mega.rollout.sglang.engine",
                     "SGLangEngineConfig.__post_init__"), ("scalerl_mega.rollout.sglang.engine",
                     "SGLangRolloutEngine.__init__"), ("scalerl_mega.rollout.sglang.engine", "_ensure_open_files"),
                     ("scalerl_mega.rollout.sglang.launch", "SGLangServerConfig.__post_init__"),
                     ("scalerl_mega.rollout.sglang.launch", "LoraServing.__post_init__"),  # peft.*: validate_peft
                     ("scalerl_mega.episodes.agent_server", "AgentEndpoint.__init__"), ("scalerl_mega.sft", "sft_batch"),
                     ("scalerl_mega.episodes.pool", "EpisodePool.__init__"),  # env.concurrency: validate_env
                     ("scalerl_mega.episodes.failures", "EpisodeFailures.__post_init__")],  # env.on_error: validate_env
                    "the processes and servers"),
}
"""Refusals the run can make before step 1 that --validate does not make, each with the step that makes them."""


def test_every_refusal_before_step_1_is_made_by_validate_or_named_here():
    """Every function the run calls before its first step that raises or checks is one --validate calls too, or
    one of `RUN_ONLY` (none stale): a new `raise` in a builder the run calls fails here until --validate makes it."""
    from callgraph import raises

    run, validate = run_and_validate_reach()
    run_only = {k for k in run - validate if raises(k) or _is_check(k)}
    assert run_only == set(RUN_ONLY), (sorted(run_only - set(RUN_ONLY)), sorted(set(RUN_ONLY) - run_only))
    # the builders the issue named are on both paths: the task (no prompt fits the length budget), the curriculum,
    # the engine configs, the episodes' targets and template
    for key in [("scalerl_mega.build", "prompts_within_limit"), ("scalerl_mega.data.curriculum", "Curriculum.__init__"),
                ("scalerl_mega.build", "local_engine_config"), ("scalerl_mega.episodes.checks", "check_env_target"),
                ("scalerl_mega.episodes.template", "ChatSplicer.check"), ("scalerl_mega.preflight", "check_backends")]:
        assert key in validate and key in run, key


NODES = {  # the config each check is made for (default: the synthetic demo)
    "dataset": ("check_data_files", "check_tokenizer_source", "check_data_rows", "check_sft_examples",
                "check_tokenizer_dir", "check_tokenizer_fits", "check_template", "check_held_out", "check_value"),
    "custom": ("check_env_target", "check_episode_template"),
    "agent": ("check_agent_target",),
    "sglang": ("check_sglang_model",),
    "hf": ("check_model_matches_hf",),
}


@pytest.mark.slow  # ~50 checks, each a --validate that builds the task: 1-4 min on 2 loaded cores
def test_every_pre_step_check_is_run_by_validate(tmp_path, monkeypatch, capsys, hf_model):
    """Each check the run makes before step 1, made to fail in turn (the others run for real on a valid config), fails `--validate`
    (`train.validate_or_exit`, what `scalerl-train --validate` calls) with exit status 2 and its message as the one
    `config error:` line: --validate calls every one of them."""
    import inspect

    from scalerl_mega import train
    from scalerl_mega.compose import compose_node

    checks = pre_step_checks()
    assert {"resolve_model", "check_data_keys", "check_synthetic_vocab", "check_data_files", "check_tokenizer_source",
            "check_data_rows", "check_sft_examples", "check_reward_settings", "check_loggers", "validate",
            "validate_machine", "check_resume", "check_world_size", "check_backends", "check_engine_settings",
            "check_episodes", "check_env_target", "check_agent_target", "check_episode_template",
            "check_sglang_model", "check_sft_batch", "check_sft_checkpoint"} <= set(checks), sorted(checks)
    where: dict[str, list] = {}  # every module attribute that is one of the check functions (imported names too)
    for mod in [m for name, m in list(sys.modules.items()) if name.startswith("scalerl_mega") and m is not None]:
        for name in checks:
            if inspect.isfunction(getattr(mod, name, None)):
                where.setdefault(name, []).append(mod)
    assert set(where) == set(checks), sorted(set(checks) - set(where))
    demo = ["experiment=demo", f"output_dir={tmp_path / 'out'}"]
    rows = _jsonl(tmp_path / "qa.jsonl", _rows(30))
    nodes = {"synthetic": demo, "dataset": [*demo, "data=jsonl", f"data.train_files=[{rows}]", "data.val_prompts=5",
                                             "sft.batch_size=8", "data.template='Q: {problem}'", *hf_model],
             "custom": ["experiment=demo_multiturn", f"output_dir={tmp_path / 'out'}"],
             "agent": [*demo, "env=agent", "env.agent._target_=tests.unit.test_validate_checks.agent",
                       "env.max_turns=1"],
             "sglang": [*demo, "rollout=sglang", "rollout.engine_urls=[http://127.0.0.1:1]"], "hf": [*demo, f"init_from_hf={tmp_path / 'ckpt'}"]}
    for name in set(where):
        kind = next((k for k, names in NODES.items() if name in names), "synthetic")
        with monkeypatch.context() as m:
            for mod in where[name]:  # every other check runs for real (and passes: each config is valid)
                m.setattr(mod, name, _failing(name))
            with pytest.raises(SystemExit) as e:
                train.validate_or_exit(compose_node(nodes[kind]))
                print(f"--validate passed with {name} failing")
        assert e.value.code == 2, name
        err = capsys.readouterr().err.strip()  # a check may say where (the file and line of a bad value)
        assert err.startswith("config error: ") and err.endswith(f"forced failure of {name}") and "\n" not in err, err


def agent(base_url: str, task: dict) -> float:
    """An agent function of the right shape (never called: --validate only imports it)."""
    raise AssertionError("not called by --validate")


def _passing(*args, **kwargs):
    return [] if kwargs.get("write") is not None else (args[0] if args else 1)


def _failing(name: str):
    def fail(*args, **kwargs):
        raise ValueError(f"forced failure of {name}")
    return fail


def test_validate_reports_a_world_size_mismatch(tmp_path, monkeypatch):
    """The trainer-ranks check the run's set-up made (WORLD_SIZE against cluster.trainer_devices) is one of
    --validate's now: under torchrun's WORLD_SIZE=2 it passes, alone it is refused."""
    bad = _cli(tmp_path, "--validate", "experiment=demo", "cluster.trainer_devices=2", f"output_dir={tmp_path / 'a'}")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "config error: cluster.trainer_devices=2 but this trainer job has WORLD_SIZE=1 ranks (set "
        "cluster.trainer_devices=1, or 0 to take it from the launcher)"), bad.stderr[-2000:]
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _compose("cluster.trainer_devices=2").cluster.trainer_devices == 2  # composes under a 2-rank launch
