"""`scalerl-train --validate` refuses what the run's start refuses (each of these passed `--validate` and was
refused by the run after the trainer was built and warm-started, 57-127 s in, or with a traceback): the episode
targets and their signatures, the chat template, a backend that is not installed, the trainer ranks, a length
budget no prompt fits, the warm start's batch. Each is one `config error:` line naming the key, exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = "tests.unit.test_validate_run_start"
MULTI = ["experiment=demo_multiturn"]


class NoStep:
    def reset(self, task: dict) -> list[dict]:
        return [{"role": "user", "content": "1+1="}]


class ResetWithoutTask:
    def reset(self) -> list[dict]:
        return []

    def step(self, reply: str) -> tuple[list[dict], float, bool]:
        return [], 0.0, True


def agent(base_url: str, task: dict) -> float:
    raise AssertionError("not called by --validate")


def agent_without_task(base_url: str) -> float:
    raise AssertionError("not called by --validate")


LAST_MESSAGE_ONLY = "{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% endif %}{% endfor %}"
"""A template that drops earlier turns: templating a longer history changes the ids of a shorter one."""


def _validate(tmp_path, *overrides: str):
    from scalerl_mega.compose import compose_run_node
    from scalerl_mega.train import validate_or_exit

    small = ["data.synthetic_num_prompts=400", "data.val_prompts=8", "sft.synthetic_num_prompts=300",
             "sft.batch_size=64"]  # a quick task to build
    validate_or_exit(compose_run_node([overrides[0], *small, *overrides[1:], f"output_dir={tmp_path / 'out'}"]))


CASES = [
    ([*MULTI, "env.custom._target_=scalerl_mega.episodes.examples.RetryArithmeticc"],
     r"env\.custom\._target_='scalerl_mega\.episodes\.examples\.RetryArithmeticc': cannot import it \(module "
     r"'scalerl_mega\.episodes\.examples' has no attribute 'RetryArithmeticc'\)"),
    ([*MULTI, f"env.custom._target_={HERE}.agent"],
     rf"env\.custom\._target_='{HERE}\.agent' is a function, not a class"),
    ([*MULTI, f"env.custom._target_={HERE}.NoStep"],
     rf"env\.custom\._target_='{HERE}\.NoStep': the class has no step\(reply\) method"),
    ([*MULTI, f"env.custom._target_={HERE}.ResetWithoutTask"],
     r"ResetWithoutTask\.reset\(self\) -> 'list\[dict\]' cannot be called as reset\(task\) \(one argument"),
    ([*MULTI, "+env.custom.kwargs.level=2"],
     r"env\.custom\.kwargs=\{'level': 2\}: LookupArithmetic\(\*, placeholder.*cannot be built with them"),
    ([*MULTI, "env.chat_template=/no/such.jinja"],
     r"env\.chat_template='/no/such\.jinja' is neither one of \['arith', 'chatml'\] nor a file"),
    ([*MULTI, "env.chat_template="], r"the tokenizer has no chat template: set env\.chat_template"),
    (["experiment=demo", "env=agent", "env.max_turns=1", "env.agent._target_=my_agents.run"],
     r"env\.agent\._target_='my_agents\.run': cannot import it .*put the directory holding my_agents/"),
    (["experiment=demo", "env=agent", "env.max_turns=1", f"env.agent._target_={HERE}.agent_without_task"],
     r"agent_without_task\(base_url: 'str'\) -> 'float' cannot be called as fn\(base_url, task\)"),
    (["experiment=demo", "data.max_prompt_tokens=3"],
     r"no prompt fits data\.max_prompt_tokens=3: the 392 prompts are 7-11 tokens"),
    (["experiment=demo", "sft.synthetic_num_prompts=300", "sft.batch_size=350"],  # the warm start's 300, less held out
     r"sft\.batch_size=350 must be in \[1, 29\d\] \(number of SFT examples\)"),
    (["experiment=demo", "cluster=slurm", "cluster.device=cpu", "cluster.trainer_devices=16"],
     r"cluster\.trainer_devices=16 but this trainer job has WORLD_SIZE=1 ranks"),
]


@pytest.mark.parametrize("overrides, line", CASES, ids=[c[0][-1] for c in CASES])
def test_validate_refuses_what_the_runs_start_refuses(tmp_path, capsys, overrides, line):
    with pytest.raises(SystemExit) as e:
        _validate(tmp_path, *overrides)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err, err
    assert err.startswith("config error: ") and __import__("re").search(line, err), err


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path, capsys):
    path = tmp_path / "last_only.jinja"
    path.write_text(LAST_MESSAGE_ONLY)
    with pytest.raises(SystemExit):
        _validate(tmp_path, *MULTI, f"env.chat_template={path}")
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"config error: env.chat_template='{path}' is not prefix-preserving: "), err
    _validate(tmp_path, *MULTI)  # the experiment's own (arith) template splices exactly
    assert capsys.readouterr().out.startswith("config OK: model 'demo_moe'")


def test_rollout_sglang_without_sglang_is_one_line_naming_how_to_install_it(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        _validate(tmp_path, "experiment=demo", "rollout=sglang")
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err == (
        f"config error: rollout=sglang launches its servers with this Python ({sys.executable}), where SGLang is not "
        "installed: `make sglang-env` builds SGLang's own environment in .venv-sglang (docs/sglang.md); serve from "
        "there and attach with rollout.engine_urls=[http://host:port], or pip install sglang here; rollout=local runs "
        "the embedded engine instead")
    _validate(tmp_path, "experiment=demo", "rollout=sglang", "rollout.engine_urls=[http://127.0.0.1:1]")  # attach
    assert capsys.readouterr().out.startswith("config OK")


@pytest.mark.slow  # two interpreters that import the package: ~1 min on 2 loaded cores
def test_the_issues_commands_are_one_line_from_the_command_line(tmp_path):
    """As a user types them: a misspelled environment and an experiment whose default rollout is SGLang."""
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "scalerl_mega.train", "--validate", *args], capture_output=True,
                              text=True, timeout=600, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})

    r = cli("experiment=demo_multiturn", "env.custom._target_=scalerl_mega.episodes.examples.RetryArithmeticc")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(
        "config error: env.custom._target_='scalerl_mega.episodes.examples.RetryArithmeticc': cannot import it"), r.stderr
    r = cli("experiment=demo", "rollout=sglang")
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "`make sglang-env`" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []  # --validate writes nothing
