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


def _called_names(func) -> list[str]:
    """The names of the functions `func`'s body calls (`f(...)` and `mod.f(...)`), in source order."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
    return [c.id if isinstance(c, ast.Name) else c.attr for c in calls if isinstance(c, (ast.Name, ast.Attribute))]


def pre_step_checks() -> dict[str, set[str]]:
    """{check function: the functions that call it} of every check the run makes before its first step: the checks of the config's
    composition (`compose.prepare`, `compose.from_node`: `validate`, `validate_machine` and what it calls),
    of the run directory (`run_dir.config_or_exit`) and of the trainer process's set-up (`train._process_setup`),
    found by reading those functions; a new `check_*` call in any of them is enumerated here without a test edit."""
    from scalerl_mega import compose, run_dir, train
    from scalerl_mega.config import machine

    import ast
    import importlib
    import inspect
    import textwrap

    out = {}
    for caller in (compose.prepare, compose.from_node, run_dir.config_or_exit, train._process_setup,
                   machine.validate_machine):
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(caller)))):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("scalerl_mega"):
                importlib.import_module(node.module)  # where the checks it imports at call time live
        for name in _called_names(caller):
            if name.startswith("check_") or name in ("resolve_model", "validate", "validate_machine"):
                out.setdefault(name, set()).add(caller.__name__)
    return out


def test_every_pre_step_check_is_run_by_validate(tmp_path, monkeypatch, capsys):
    """Each check the run makes before step 0, made to fail in turn (every other check passing), fails `--validate`
    (`run_dir.config_or_exit(validate_only=True)`, what `scalerl-train --validate` calls) with exit status 2 and its
    message as the one `config error:` line: --validate calls every one of them."""
    import inspect

    from scalerl_mega import train
    from scalerl_mega.compose import compose_node
    from scalerl_mega.run_dir import config_or_exit

    checks = pre_step_checks()
    assert {"resolve_model", "check_data_keys", "check_synthetic_vocab", "check_data_files", "check_tokenizer_source",
            "check_data_rows", "check_sft_examples", "check_reward_settings", "check_loggers", "validate",
            "validate_machine", "check_resume", "check_world_size"} <= set(checks), sorted(checks)
    # the run's set-up checks nothing --validate does not: the process set-up's only check is check_world_size
    assert [n for n in _called_names(train._process_setup) if n.startswith("check_")] == ["check_world_size"]
    where: dict[str, list] = {}  # every module attribute that is one of the check functions (imported names too)
    for mod in [m for name, m in list(sys.modules.items()) if name.startswith("scalerl_mega") and m is not None]:
        for name in checks:
            if inspect.isfunction(getattr(mod, name, None)):
                where.setdefault(name, []).append(mod)
    nodes = {"synthetic": compose_node(["experiment=demo", f"output_dir={tmp_path / 's'}"]),
             "dataset": compose_node(["experiment=demo", "data=jsonl", f"data.train_files=[{tmp_path / 'qa.jsonl'}]",
                                      f"data.tokenizer_path={tmp_path / 'tok'}", f"output_dir={tmp_path / 'd'}"])}
    dataset_only = {"check_data_files", "check_tokenizer_source", "check_data_rows", "check_sft_examples",
                    "check_tokenizer_dir", "check_tokenizer_fits"}
    for name in checks:
        with monkeypatch.context() as m:
            for other, mods in where.items():
                if other not in checks[name]:  # a check that calls this one (validate_machine) runs for real
                    for mod in mods:
                        m.setattr(mod, other, _passing if other != name else _failing(name))
            node = nodes["dataset" if name in dataset_only else "synthetic"]
            with pytest.raises(SystemExit) as e:
                config_or_exit(node, validate_only=True)
                print(f"--validate passed with {name} failing")
        assert e.value.code == 2, name
        assert capsys.readouterr().err.strip() == f"config error: forced failure of {name}", name


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
