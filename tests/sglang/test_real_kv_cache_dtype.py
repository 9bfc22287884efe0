"""`rollout.kv_cache_dtype` against SGLang 0.5.23 itself: the project's whole launch argv for each value, parsed by
SGLang's own server-argument parser in the generator environment, gives that `kv_cache_dtype`. No server starts:
SGLang 0.5.23 on a CPU refuses both FP8 KV caches at startup ("CPU FP8 KV cache requires Intel AMX support." for
fp8_e4m3 on a CPU without AMX, "--kv-cache-dtype fp8_e5m2 is not supported on CPU." for fp8_e5m2), so what the
servers do with them waits for a GPU."""

from __future__ import annotations

import json
import subprocess

import pytest

from scalerl_mega.config.rollout import KV_CACHE_DTYPES
from scalerl_mega.rollout.sglang.launch import SGLangServerConfig, launch_command
from tests.sglang_support.real_server import CPU_ARGS, sglang_python

pytestmark = pytest.mark.sglang

PARSE = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(allow_abbrev=False)  # the exact flag names
ServerArgs.add_cli_args(parser)
print(json.dumps([parser.parse_args(argv).kv_cache_dtype for argv in json.load(sys.stdin)]))
"""


def test_sglangs_parser_reads_the_launch_argv_kv_cache_dtype(llama_dir):
    py = sglang_python()
    argvs = []
    for kv in KV_CACHE_DTYPES:
        cmd = launch_command(SGLangServerConfig(model_path=llama_dir, python=py, dtype="float32", kv_cache_dtype=kv,
                                                extra_args=CPU_ARGS))
        assert cmd[1:3] == ["-m", "sglang.launch_server"]
        argvs.append(cmd[3:])
    r = subprocess.run([py, "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == list(KV_CACHE_DTYPES)
