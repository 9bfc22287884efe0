"""Requests/s of the SGLang /generate client: the engine's pooled event-loop client (servers x
`max_inflight_per_server` in flight) vs the old fixed pool of 256 threads making blocking `requests`
calls, measured in the same run against the same model-free stub servers (`tests/support/stub_server.py`,
run in a child process so the client's CPU is measured alone).

Each stub request waits `--delay-s` before answering (a stand-in for the decode time of a real
generation, where the number in flight is what bounds throughput), then `--delay-s 0` shows the
per-request client cost alone. Prints one line per (client, delay) with the client process's CPU
time per request (all its threads; the stubs run in another process) and the ratios; `--json PATH`
writes them too.

    PYTHONPATH=. .venv/bin/python bench/sglang_client_concurrency.py [--servers 8 --requests 4096]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OLD_THREADS = 256  # the old SGLangEngineConfig.max_concurrency, never sized by build.py


def _serve(num_ports: int, delay_s: float, conn) -> None:
    from tests.support.stub_server import StubGenerateServer

    stub = StubGenerateServer(num_ports=num_ports, delay_s=delay_s).start()
    conn.send(stub.urls)
    conn.recv()  # stop
    conn.send(stub.peak)
    stub.stop()


def _requests(n: int):
    from scalerl_mega.rollout.local import make_requests
    from scalerl_mega.types import Prompt, SamplingParams

    sp = SamplingParams(max_new_tokens=16)
    out = []
    for i in range(n // 8):
        p = Prompt(prompt_id=f"p{i}", text="", task="synthetic", gold="0", token_ids=list(range(i % 50, i % 50 + 64)))
        out += make_requests(p, sp, n=8, version=0, base_seed=0)
    return out


def run_old(urls: list[str], reqs, *, passes: int) -> list[tuple[float, float]]:
    """The pre-issue-26 path: ThreadPoolExecutor(256) of `SGLangClient.generate` (a requests.Session
    per server) + parse, requests spread over the servers least-loaded first (round-robin here)."""
    from scalerl_mega.rollout.sglang import SGLangClient, parse_generate_response, sglang_sampling_params

    clients = [SGLangClient(u) for u in urls]

    def one(i, r):
        c = clients[i % len(clients)]
        body = c.generate(input_ids=r.prompt_ids, sampling_params=sglang_sampling_params(r.sampling, seed=r.seed),
                          rid=r.rid)
        return parse_generate_response(body)

    out = []
    with ThreadPoolExecutor(max_workers=OLD_THREADS, thread_name_prefix="old-gen") as pool:
        for _ in range(passes):
            t0, c0 = time.monotonic(), time.process_time()
            futs = [pool.submit(one, i, r) for i, r in enumerate(reqs)]
            wait(futs)
            out.append((time.monotonic() - t0, time.process_time() - c0))
            assert all(len(f.result().output_ids) == 16 for f in futs)
    return out


def run_new(urls: list[str], reqs, *, per_server: int, passes: int) -> list[tuple[float, float]]:
    from scalerl_mega.rollout.sglang import SGLangEngineConfig, SGLangRolloutEngine, SGLangServer
    from scalerl_mega.weight_sync import WeightSyncConfig

    engine = SGLangRolloutEngine([SGLangServer.attach(u) for u in urls], config=SGLangEngineConfig(
        sync=WeightSyncConfig(backend="gloo"), max_inflight_per_server=per_server))
    try:
        out = []
        for _ in range(passes):
            t0, c0 = time.monotonic(), time.process_time()
            for r in reqs:
                engine._dispatch(r)
            done = []
            while len(done) < len(reqs):
                done += engine.poll(1.0)
            out.append((time.monotonic() - t0, time.process_time() - c0))
            assert all(len(c.output_ids) == 16 for c in done)
    finally:
        engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4096)
    ap.add_argument("--per-server", type=int, default=256, help="rollout.max_batch_size")
    ap.add_argument("--delays", type=float, nargs="+", default=[5.0, 0.0])
    ap.add_argument("--passes", type=int, default=2, help="pass 0 opens the connections, later ones reuse them")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    reqs = _requests(args.requests)
    rows = []
    ctx = mp.get_context("spawn")
    for delay in args.delays:
        for name in ("old", "new"):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(args.servers, delay, child), daemon=True)
            proc.start()
            try:
                urls = parent.recv()
                runs = (run_old(urls, reqs, passes=args.passes) if name == "old"
                        else run_new(urls, reqs, per_server=args.per_server, passes=args.passes))
                parent.send("stop")
                peak = parent.recv()
            finally:
                proc.join(60)
                if proc.is_alive():
                    proc.kill()
            for k, (dt, cpu) in enumerate(runs):
                row = {"client": name, "delay_s": delay, "pass": k, "requests": len(reqs), "servers": args.servers,
                       "seconds": round(dt, 3), "requests_per_s": round(len(reqs) / dt, 1), "peak_in_flight": peak,
                       "client_cpu_ms_per_request": round(1e3 * cpu / len(reqs), 3)}
                rows.append(row)
                print(f"{name:>3} client  delay {delay:.2f}s  pass {k}  {len(reqs)} requests over {args.servers} "
                      f"servers: {dt:7.2f} s  {len(reqs) / dt:8.1f} req/s  client CPU {1e3 * cpu / len(reqs):.2f} "
                      f"ms/request  (stub peak in flight {peak})", flush=True)
        for k in range(args.passes):
            old, new = [r for r in rows if r.get("delay_s") == delay and r.get("pass") == k]
            ratio = new["requests_per_s"] / old["requests_per_s"]
            rows.append({"delay_s": delay, "pass": k, "ratio_new_over_old": round(ratio, 2)})
            print(f"    delay {delay:.2f}s pass {k}: new / old = {ratio:.2f}x req/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
