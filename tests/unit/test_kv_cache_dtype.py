"""`rollout.kv_cache_dtype` (auto | fp8_e4m3 | fp8_e5m2): checked at `--validate`, refused with the local engine
(it has no FP8 KV cache), passed to every SGLang server the trainer launches as SGLang's `--kv-cache-dtype`, and
counted by the dry run's generator estimate at one byte per cached K or V element. The Slurm scripts' flag:
tests/unit/test_slurm_scripts.py; SGLang's own parser on the launch argv: tests/sglang/test_real_kv_cache_dtype.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SGLANG = ["experiment=demo", "rollout=sglang", "rollout.engine_urls=[http://127.0.0.1:1]"]


def _compose(*overrides: str):
    from scalerl_mega.compose import compose

    return compose(list(overrides))


def test_a_typo_is_refused_naming_the_key_and_the_values():
    with pytest.raises(ValueError) as e:
        _compose(*SGLANG, "rollout.kv_cache_dtype=fp8")
    assert str(e.value) == "rollout.kv_cache_dtype='fp8' is not one of ['auto', 'fp8_e4m3', 'fp8_e5m2']"
    assert _compose(*SGLANG, "rollout.kv_cache_dtype=fp8_e5m2").rollout.kv_cache_dtype == "fp8_e5m2"
    assert _compose(*SGLANG).rollout.kv_cache_dtype == "auto"


def test_the_local_engine_refuses_an_fp8_kv_cache_at_validate(tmp_path):
    """The local engine caches K and V in the model dtype: `--validate` exits 2 with one line naming the key and
    saying it is SGLang-only."""
    r = subprocess.run([sys.executable, "-c", "from scalerl_mega.train import main; main()", "--validate",
                        "experiment=demo", "rollout.kv_cache_dtype=fp8_e4m3", f"output_dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert r.returncode == 2 and r.stderr.strip() == (
        "config error: rollout.kv_cache_dtype='fp8_e4m3' is SGLang-only (the servers' --kv-cache-dtype): "
        "rollout=local keeps its KV cache in the model dtype; use rollout=sglang, or rollout.kv_cache_dtype=auto"), \
        r.stderr[-2000:]


def test_launch_argv_carries_the_kv_cache_dtype_unless_auto():
    from scalerl_mega.rollout.sglang.launch import SGLangServerConfig, launch_command

    cmd = launch_command(SGLangServerConfig(model_path="/m", kv_cache_dtype="fp8_e4m3"))
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert "--kv-cache-dtype" not in launch_command(SGLangServerConfig(model_path="/m"))
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8'"):
        SGLangServerConfig(model_path="/m", kv_cache_dtype="fp8")


def test_the_servers_the_trainer_launches_get_the_configs_kv_cache_dtype(monkeypatch, tmp_path):
    """`build.build_sglang_engine` without `rollout.engine_urls`: each of the two servers it launches is started
    with `--kv-cache-dtype fp8_e5m2` (the checkpoint write and the launch itself stubbed)."""
    import scalerl_mega.rollout.sglang as sg
    from scalerl_mega import build
    from scalerl_mega.rollout.sglang.launch import launch_command

    cfg = _compose("experiment=demo", "rollout=sglang", "rollout.num_engines=2", "rollout.kv_cache_dtype=fp8_e5m2",
                   f"output_dir={tmp_path}")
    argvs = []

    def launch(cls, config, *, wait=True):
        argvs.append(launch_command(config))
        return cls(url=config.url, config=config)

    monkeypatch.setattr(build, "write_hf_checkpoint", lambda cfg, task, trainer, path: path)
    monkeypatch.setattr(sg.SGLangServer, "launch", classmethod(launch))
    monkeypatch.setattr(sg, "SGLangRolloutEngine", lambda servers, config: servers)
    assert len(build.build_sglang_engine(cfg, None, None)) == 2
    assert [a[a.index("--kv-cache-dtype") + 1] for a in argvs] == ["fp8_e5m2", "fp8_e5m2"]


@pytest.mark.parametrize("kv, tp, element_bytes", [("auto", 1, 4), ("fp8_e4m3", 1, 1), ("fp8_e5m2", 2, 1)])
def test_the_dry_runs_generator_kv_follows_the_config(kv, tp, element_bytes):
    """The demo model (4 layers, 2 KV heads of 128 / 4 = 32 dims, FP32 body: auto caches 4 bytes per element, FP8
    one): per token 2 (K, V) x 4 x (2 / tp) x 32 x bytes on each GPU of a TP-`tp` server; the estimate holds
    `train.generations_per_prompt` sequences of the run's length."""
    from scalerl_mega.dry_run import generator_estimate

    cfg = _compose(*SGLANG, f"rollout.kv_cache_dtype={kv}", f"rollout.sglang_tp_size={tp}")
    g = generator_estimate(cfg)
    per_tok = 2 * 4 * (2 // tp) * 32 * element_bytes
    assert (g["kv_cache_dtype"], g["kv_bytes_per_token"]) == (kv, per_tok)
    assert g["kv_cache_bytes"] == per_tok * g["seq_len"] * cfg.train.generations_per_prompt


def test_the_planner_and_the_config_take_the_same_values(monkeypatch):
    """tools/plan.py's `--kv-cache-dtype` choices are the config's, each a value SGLang 0.5.23 accepts."""
    import importlib

    from scalerl_mega.config.rollout import KV_CACHE_DTYPES
    from scalerl_mega.rollout.sglang.launch import KV_CACHE_DTYPES as SGLANG_CHOICES

    monkeypatch.setattr(sys, "path", [str(REPO / "tools"), *sys.path])
    plan_tool = importlib.import_module("plan")
    assert plan_tool.KV_CACHE_BYTES == {"auto": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
    assert set(KV_CACHE_DTYPES) == set(plan_tool.KV_CACHE_BYTES) and set(KV_CACHE_DTYPES) <= set(SGLANG_CHOICES)
