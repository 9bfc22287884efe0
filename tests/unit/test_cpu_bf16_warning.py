"""bf16 parameters on a CPU without native bf16 are emulated and several times slower than FP32
(4.7x on the reproduction config on an AVX2-only machine). `experiment=scalerl` composes bf16, so a
CPU run says so once at start-up (`config.validate_machine`), with the FP32 override to use."""

from __future__ import annotations

import logging

import pytest

X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
X86_AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n"
X86_AMX = "flags\t\t: avx2 amx_bf16 amx_tile\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd evtstrm bf16 i8mm\n"
ARM_NO_BF16 = "processor\t: 0\nFeatures\t: fp asimd evtstrm\n"


@pytest.mark.parametrize("text,native", [(X86_AVX2, False), (X86_AVX512_BF16, True), (X86_AMX, True),
                                         (ARM_BF16, True), (ARM_NO_BF16, False)],
                         ids=["avx2", "avx512_bf16", "amx_bf16", "arm_bf16", "arm_plain"])
def test_native_bf16_is_read_from_cpu_flags(text, native):
    from scalerl_mega.config import cpu_native_bf16

    assert cpu_native_bf16(text) is native


def test_warns_once_with_the_override_and_only_on_rank_0(monkeypatch, caplog):
    import scalerl_mega.config.machine as config

    monkeypatch.setattr(config, "_cpu_bf16_warned", False)
    monkeypatch.setenv("RANK", "1")
    assert config.warn_cpu_bf16(cpuinfo=X86_AVX2) is False  # followers stay quiet
    monkeypatch.setenv("RANK", "0")
    assert config.warn_cpu_bf16(cpuinfo=X86_AVX512_BF16) is False  # native bf16: nothing to say
    with caplog.at_level(logging.WARNING, logger="scalerl_mega.config"):
        assert config.warn_cpu_bf16(cpuinfo=X86_AVX2) is True
        assert config.warn_cpu_bf16(cpuinfo=X86_AVX2) is False  # once per process
    (rec,) = [r for r in caplog.records if r.name == "scalerl_mega.config"]
    assert "precision.params_dtype=float32" in rec.getMessage() and "no native bf16" in rec.getMessage()


def test_scalerl_on_cpu_warns_at_start_up_and_the_override_is_quiet(monkeypatch, caplog, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_hf_model_config import _compose

    import scalerl_mega.config.machine as config

    monkeypatch.setattr(config, "cpu_native_bf16", lambda cpuinfo=None: False)  # an AVX2-only host
    monkeypatch.delenv("RANK", raising=False)
    c = _compose("experiment=scalerl", "cluster=local", "cluster.device=cpu")
    assert c.precision.params_dtype == "bfloat16"  # what experiment=scalerl composes
    for overrides, warned in ((("precision.params_dtype=float32",), False), ((), True)):
        monkeypatch.setattr(config, "_cpu_bf16_warned", False)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="scalerl_mega.config"):
            config.validate_machine(_compose("experiment=scalerl", "cluster=local", "cluster.device=cpu", *overrides))
        assert any("precision.params_dtype=float32" in r.getMessage() for r in caplog.records) is warned
