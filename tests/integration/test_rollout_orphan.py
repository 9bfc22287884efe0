"""The local engine process exits by itself when the process that started it is `kill -9`ed.

A parent interpreter starts a `LocalRolloutEngine` (tiny random Llama), keeps it decoding (busy case)
or leaves it idle, prints the engine's pid and sleeps; the test kills the parent with SIGKILL (no
cleanup code runs there) and waits for the engine pid to disappear.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

PARENT = textwrap.dedent("""
    import sys, time
    from scalerl_mega.rollout.core import CoreConfig
    from scalerl_mega.rollout.local import LocalEngineConfig, LocalModelSpec, LocalRolloutEngine
    from scalerl_mega.types import Prompt, SamplingParams

    if __name__ == "__main__":
        cfg = dict(vocab_size=53, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False)
        engine = LocalRolloutEngine(LocalEngineConfig(
            model=LocalModelSpec(arch="llama", config=cfg), core=CoreConfig(max_batch=4, max_seq_len=4096),
            parent_check_s=0.5))
        if sys.argv[1] == "busy":
            p = Prompt(prompt_id="p", text="", task="synthetic", gold="0", token_ids=[3, 4, 5])
            engine.submit(p, SamplingParams(max_new_tokens=4000, temperature=1.0), n=4, version=0)
        print(engine.pid, flush=True)
        time.sleep(600)
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited, not yet reaped by init
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("state", ["idle", "busy"])
def test_engine_exits_when_parent_is_killed(state):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, state], stdout=subprocess.PIPE, text=True, env=env)
    engine_pid = None
    try:
        line = parent.stdout.readline()  # blocks until the engine is up (or the parent died)
        assert line.strip().isdigit(), f"parent did not report the engine pid: {line!r}"
        engine_pid = int(line)
        engine = psutil.Process(engine_pid)
        assert engine.ppid() == parent.pid and not _gone(engine_pid)
        if state == "busy":
            time.sleep(1.0)
            assert engine.cpu_times().user > 0.0
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=600)
        deadline = time.monotonic() + 20.0
        while not _gone(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(engine_pid), f"engine {engine_pid} still alive after its parent was killed"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if engine_pid is not None and not _gone(engine_pid):
            os.kill(engine_pid, signal.SIGKILL)
