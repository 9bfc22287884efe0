"""Cost of --disable-radix-cache on the real CPU server (docs/sglang.md): a GRPO group -- 8 samples of one
new 120-token prompt, 16 new tokens each, sent as one batched /generate -- timed 4 times (median of the last 3),
with the cached prompt tokens SGLang reports.

    PYTHONPATH=. .venv/bin/python -m tests.sglang_support.radix_cost MODEL_DIR in_place   # radix cache off
    PYTHONPATH=. .venv/bin/python -m tests.sglang_support.radix_cost MODEL_DIR retract    # SGLang's default: on
"""

from __future__ import annotations

import statistics
import sys
import time

import requests

from tests.sglang_support.real_server import launch


def main(model_dir: str, pause_mode: str) -> None:
    server = launch(model_dir, pause_mode=pause_mode)
    try:
        times, cached = [], []
        for rep in range(4):
            prompt = [1] + [(rep * 131 + i) % 1000 + 3 for i in range(119)]  # a new prompt per group
            body = {"input_ids": [prompt] * 8, "sampling_params": {"max_new_tokens": 16, "temperature": 1.0},
                    "return_logprob": True}
            t0 = time.perf_counter()
            out = requests.post(server.url + "/generate", json=body, timeout=300).json()
            times.append(time.perf_counter() - t0)
            cached.append(sum(o["meta_info"]["cached_tokens"] for o in out))
        radix = "off" if pause_mode == "in_place" else "on"
        print(f"radix cache {radix}: group of 8 x (120 prompt + 16 new) median {statistics.median(times[1:]):.3f}s "
              f"of {[round(t, 3) for t in times[1:]]}; cached prompt tokens per group {cached}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
