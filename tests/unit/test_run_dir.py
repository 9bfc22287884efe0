"""Safe run management: a run dir's saved config guards resume; config errors exit 2 in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _config(out: Path, *overrides: str):
    from test_hf_model_config import _compose

    from scalerl_mega.compose import prepare

    return prepare(_compose("experiment=demo", f"output_dir={out}", *overrides))


def _fake_checkpoint(out: Path) -> None:
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step_1\n")


def test_differences_ignore_resumable_keys():
    from scalerl_mega.run_dir import config_differences

    saved = {"loss.name": "cispo", "train.steps": 10, "metrics.tensorboard": True, "model.hidden_size": 64}
    new = {"loss.name": "dapo", "train.steps": 20, "metrics.tensorboard": False, "model.hidden_size": 64,
           "reward.custom": None}
    assert config_differences(saved, new) == ["loss.name: 'cispo' -> 'dapo'", "reward.custom: (absent) -> None"]


def test_resume_with_other_loss_is_refused_and_force_overrides(tmp_path):
    from scalerl_mega.run_dir import SAVED, check_resume, load_saved

    first = _config(tmp_path)
    assert check_resume(first) == [] and (tmp_path / SAVED).is_file()  # fresh run: recorded
    _fake_checkpoint(tmp_path)
    assert check_resume(_config(tmp_path, "train.steps=500")) == []  # extending a run is fine
    # where a fresh run would find its warm start does not matter to a resumed one (it skips the warm start)
    assert check_resume(_config(tmp_path, "sft.checkpoint=/elsewhere", "sft.any_seed=true")) == []
    with pytest.raises(ValueError) as e:
        check_resume(_config(tmp_path, "loss=dapo", "optim.lr=0.001"))
    msg = str(e.value)
    assert "differs in 4 key(s)" in msg and "loss.name: 'cispo' -> 'dapo'" in msg and "optim.lr: 0.0001 -> 0.001" in msg
    assert "loss.eps_high: 5.0 -> 0.28" in msg and "loss.eps_low: None -> 0.2" in msg
    assert "use another run_name= (runs go to outputs/<run_name>/seed<seed>) or output_dir=" in msg
    forced = _config(tmp_path, "loss=dapo", "optim.lr=0.001", "resume=force")
    assert len(check_resume(forced)) == 4 and forced.resume == "auto"  # the loop resumes as usual
    assert load_saved(tmp_path)["loss.name"] == "dapo"  # the new config is now the run's
    assert check_resume(_config(tmp_path, "loss=dapo", "optim.lr=0.001")) == []
    # no checkpoint: a new run in an old dir is not a resume
    other = tmp_path / "other"
    check_resume(_config(other))
    assert check_resume(_config(other, "loss=dapo")) == []


def _cli(tmp_path, *args):
    return subprocess.run([sys.executable, "-c", "from scalerl_mega.train import main; main()", *args],
                          capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})


def test_cli_config_errors_one_line_exit_2_and_validate(tmp_path):
    out = tmp_path / "run"
    ok = _cli(tmp_path, "--validate", "experiment=demo", f"output_dir={out}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "config OK: model" in ok.stdout and not (out / "run_config.yaml").exists()  # validate writes nothing
    out.mkdir()
    _config(out)  # a run in `out` with a checkpoint, whose saved config uses cispo
    from scalerl_mega.run_dir import write_config

    write_config(_config(out), out)
    _fake_checkpoint(out)
    for args, line in [(("experiment=demo", "loss=dapo"), "loss.name: 'cispo' -> 'dapo'"),
                       (("experiment=demo", "rollout.top_p=1.5"), "rollout.top_p=1.5 must be in (0, 1]"),
                       (("experiment=demo", "data=jsonl"), "data.train_files is empty"),
                       (("experiment=demo", "train.steps=abc"), "train.steps=abc; Value 'abc' of type 'str' "
                                                                "could not be converted to Integer")]:
        bad = _cli(tmp_path, "--validate", *args, f"output_dir={out}")
        assert bad.returncode == 2, (args, bad.stderr[-2000:])
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("config error: ") and line in lines[0], bad.stderr


@pytest.mark.parametrize("arg, line", [
    ("train.stepz=3", "config error: unknown key 'train.stepz' (did you mean train.steps?)"),
    ("+train.stepz=3", "config error: unknown key 'train.stepz' (did you mean train.steps?)"),  # `+` added it silently
    ("trian.steps=3", "config error: unknown key 'trian.steps' (did you mean train.steps?)"),
    ("los=cispo", "config error: unknown key or group 'los' (did you mean loss?)"),
    ("loss=cispoo", "config error: loss=cispoo: no option 'cispoo' in conf/loss/ (did you mean cispo?); options: "
                    "cispo, dapo, grpo, gspo"),
    ("--validat", "config error: unknown option --validat (did you mean --validate?)"),
    # a config key written as a flag was offered `--run`
    ("--dry-run", "config error: unknown option --dry-run: dry_run is a config key, written dry_run=<value> "
                  "(e.g. dry_run=true)"),
])
def test_misspelled_names_get_a_did_you_mean_not_hydras_plus_advice(tmp_path, arg, line):
    """A typo got Hydra's advice to append it with `+` (which then adds the typo silently)."""
    bad = _cli(tmp_path, "--validate", "experiment=demo", arg, f"output_dir={tmp_path / 'run'}")
    assert bad.returncode == 2 and bad.stderr.strip() == line, bad.stderr
    assert "+train" not in bad.stderr and "To append" not in bad.stderr


def test_override_names_checked_against_the_schema_and_conf_groups():
    from scalerl_mega.config.keys import override_problem

    for ok in ("reward.custom._target_=pkg.fn", "+reward.custom.scale=2", "experiment=reproduction/predictability",
               "hydra.run.dir=x", "loss=cispo,dapo", "model=hf", "seed=1", "data.train_files=[a,b]", "experiment=null"):
        assert override_problem(ok) is None, ok
    assert override_problem("model.hiden_size=3") == "unknown key 'model.hiden_size' (did you mean model.hidden_size?)"
    assert override_problem("train.steps.x=1") == "'train.steps' has no keys below it (it is a value): 'train.steps.x'"
    assert override_problem("train.zzzz=1").startswith("unknown key 'train.zzzz'; the keys of train: ")


def test_a_misspelled_option_in_a_multirun_sweep_is_one_line(capsys):
    """`-m loss=cispo,dapoo` got Hydra's 13-line error (single runs said "did you mean")."""
    from scalerl_mega.run_dir import precheck_overrides

    with pytest.raises(SystemExit) as e:
        precheck_overrides(["-m", "experiment=demo", "loss=cispo,dapoo"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == ("config error: loss=cispo,dapoo: no option 'dapoo' in conf/loss/ "
                                               "(did you mean dapo?); options: cispo, dapo, grpo, gspo")


def test_scalerl_fit_flags_get_a_did_you_mean(capsys):
    from scalerl_mega.scaling.cli import _parser

    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--plotdir", "p"])
    assert "unrecognized arguments: --plotdir (did you mean --plot-dir?) p" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--grid", "papr"])
    assert "invalid choice: 'papr'" in (err := capsys.readouterr().err) and "(did you mean paper?)" in err


def test_start_banner_names_output_recipe_model_and_schedule(tmp_path):
    """The console's first lines (printed before the heavy imports) say where the run writes, its
    recipe, model size and steps, and whether it resumes."""
    from scalerl_mega.run_dir import start_banner

    lines = start_banner(_config(tmp_path / "run")).splitlines()
    assert lines[0] == f"scalerl-train: run 'demo' (seed 0) -> {tmp_path / 'run'} (report.md there at the end)"
    assert lines[1].split()[1:4] == ["loss=cispo", "aggregation=prompt", "adv_norm=batch"]
    assert "off_policy=pipeline_rl(k=2)" in lines[1] and "precision=fp32_head" in lines[1]
    assert lines[2].startswith("  model   'demo_moe': 0.7M parameters (4 layers, hidden 128, MoE 4 experts top-1); "
                               "data=synthetic")
    assert lines[3] == ("  steps   250 SFT warm-start steps, then 80 RL steps x 32 prompts x 8 samples; validation every "
                        "10 steps on 200 held-out prompts x 4")
    from tests.support.fake_checkpoint import save_fake_checkpoint

    save_fake_checkpoint(tmp_path / "run" / "checkpoints", 40)
    assert start_banner(_config(tmp_path / "run")).splitlines()[3].startswith("  steps   resuming at step 40 of 80 RL")


def test_help_is_short_and_names_validate(tmp_path):
    """`--help` was 248 lines of Hydra's help without `--validate`; now the project's usage, the flags a
    user needs and every config group with its options (conf/train.yaml hydra.help)."""
    r = _cli(tmp_path, "--help")
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines[0].startswith("scalerl-train [--validate]"), r.stdout[:500] + r.stderr[-500:]
    assert len(lines) < 40 and any(ln.strip().startswith("--validate ") for ln in lines)
    assert any(ln.startswith("model: ") and "tiny_qwen3_moe" in ln for ln in lines)
    assert any(ln.startswith("experiment: ") and "qwen3_moe" in ln for ln in lines)


def test_banner_names_the_users_data_files(tmp_path):
    """The banner said `data=polaris` for the user's own JSONL."""
    from test_hf_model_config import _compose

    from scalerl_mega.run_dir import data_label, start_banner

    cfg = _compose("experiment=demo", f"output_dir={tmp_path / 'run'}", "data=polaris",
                   "data.train_files=[/d/mine.jsonl,/d/more.parquet]")  # composed only: the files are not read
    assert data_label(cfg) == "polaris (mine.jsonl + 1 more)"
    assert "data=polaris (mine.jsonl + 1 more), reward=" in start_banner(cfg)
    assert data_label(_config(tmp_path / "run2")) == "synthetic"


def test_model_hf_is_named_by_its_checkpoint_and_presets_by_their_own_names(tmp_path):
    """`model=hf` printed 'hf' in the banner and in `--validate`'s line; now the checkpoint's directory
    name and config.json's model_type; a preset prints its own name."""
    from test_hf_model_config import SMOLLM2_135M, _ckpt, _compose

    from scalerl_mega.model.hf_import import resolve_model
    from scalerl_mega.run_dir import model_label, start_banner

    ckpt = Path(_ckpt(tmp_path, SMOLLM2_135M, name="SmolLM2-135M"))
    cfg = resolve_model(_compose("experiment=scalerl", f"init_from_hf={ckpt}", "model=hf",
                                 f"output_dir={tmp_path / 'run'}"))
    label = f"'{ckpt.name}' (model=hf, llama, from {ckpt})"
    assert model_label(cfg) == label
    assert start_banner(cfg).splitlines()[2].startswith(f"  model   {label}: 134.5M parameters (30 layers, hidden 576)")
    assert model_label(_compose("experiment=demo", "model=tiny_qwen3")) == "'tiny_qwen3'"
    ok = _cli(tmp_path, "--validate", "experiment=demo", "model=tiny_qwen3", f"output_dir={tmp_path / 'v'}")
    assert ok.returncode == 0 and ok.stdout.startswith("config OK: model 'tiny_qwen3' ("), ok.stderr[-2000:]
