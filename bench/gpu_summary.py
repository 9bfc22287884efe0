"""tools/gpu_check.sh's first and last step: the versions line, and summary.json from the stages' outputs.

    python3 bench/gpu_summary.py --versions                       # python, torch, CUDA, Triton, ... versions
    python3 bench/gpu_summary.py --out OUT --mode gpu --stage=gpu_suite:0:190 ...   # OUT/summary.json

summary.json: `mode`; `stages` (rc and wall seconds of each); `versions`; `gpu_suite` (pytest's counts);
`head` (the trainer's head call at the benchmarked shape: `error` against float64 with the GPU suite's
bounds, `time_over_naive` and `mem_over_naive`, and the 3xTF32 mode's time over naive when measured);
`rl_loop` (steps, tokens/s, trainer MFU, push seconds, whether the resume matched; bench/rl_loop.py);
`ok`: every stage exited 0, no suite test failed, the head is within the bounds and the resume matched.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HEAD_BOUNDS = {"err_loss_rel": 1e-4, "err_logp_abs": 1e-4, "err_grad_h_rel": 2e-5, "err_grad_w_rel": 2e-5}
"""tests/gpu/test_fused_logprob_gpu.py's bounds for FP32 inputs (the head benchmark's hidden states are FP32)."""
PACKAGES = ("torch", "triton", "numpy", "megatron-core", "transformers", "hydra-core", "omegaconf", "tokenizers")


def versions() -> dict[str, str | None]:
    """Python and the installed distributions' versions (metadata only: nothing heavy is imported but torch,
    for the CUDA version and the device)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    try:
        import torch

        out["cuda"] = torch.version.cuda
        out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        out["device"] = f"torch failed: {type(e).__name__}: {e}"
    return out


def pytest_counts(log: str) -> dict[str, int]:
    """passed / failed / skipped / error counts of pytest's last summary line in `log` (0 when absent)."""
    lines = [ln for ln in log.splitlines() if re.search(r"\b(passed|failed|skipped|error|errors)\b", ln)
             and re.search(r"\d+ (passed|failed|skipped|error)", ln)]
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if lines:
        for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1]):
            counts["errors" if what.startswith("error") else what] = int(n)
    return counts


def head_summary(rows: list[dict]) -> dict:
    """The trainer variant at the largest measured shape, against naive (and 3xTF32's triton row) there."""
    if not rows:
        return {"measured": False}
    shape = max({(r["N"], r["H"], r["V"]) for r in rows}, key=lambda s: s[0] * s[1] * s[2])
    at = {r["variant"]: r for r in rows if (r["N"], r["H"], r["V"]) == shape}
    out: dict = {"measured": "trainer" in at, "shape": list(shape), "inputs": "bf16-valued FP32 hidden, FP32 weight"}
    tr, naive = at.get("trainer"), at.get("naive")
    if tr is None:
        return out
    err = {k: tr[k] for k in HEAD_BOUNDS if k in tr}
    out["error"] = err
    out["within_bounds"] = bool(err) and all(v <= HEAD_BOUNDS[k] for k, v in err.items())
    out["time_s"] = tr["time_s"]
    if naive:
        out["naive_time_s"] = naive["time_s"]
        out["time_over_naive"] = tr["time_s"] / naive["time_s"]
        if "peak_gib" in tr and naive.get("peak_gib"):
            out["mem_over_naive"] = tr["peak_gib"] / naive["peak_gib"]
        if "triton" in at:
            out["tf32x3_time_over_naive"] = at["triton"]["time_s"] / naive["time_s"]
    return out


def rl_summary(res: dict | None) -> dict:
    if not res:
        return {"measured": False}
    keys = ("device", "params", "steps", "resumed_steps", "tokens_per_s", "train_tokens_per_s", "mfu",
            "trainer_tflops", "push_s", "resume_matched", "resume")
    return {"measured": True, **{k: res.get(k) for k in keys}}


def _versions_of(path: Path) -> dict | None:
    """The `versions {json}` line of versions.txt (`--versions`), or None."""
    lines = path.read_text().splitlines() if path.is_file() else []
    found = [ln for ln in lines if ln.startswith("versions {")]
    return json.loads(found[-1][len("versions "):]) if found else None


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def summarize(out: Path, *, mode: str, stages: list[str]) -> dict:
    st = {}
    for s in stages:
        name, rc, wall = s.rsplit(":", 2)
        st[name] = {"rc": int(rc), "wall_s": int(wall)}
    suite_log = out / "gpu_suite.log"
    summary = {"mode": mode, "stages": st, "versions": _versions_of(out / "versions.txt"),
               "gpu_suite": pytest_counts(suite_log.read_text() if suite_log.is_file() else ""),
               "head": head_summary(_load(out / "head.json") or []), "rl_loop": rl_summary(_load(out / "rl_loop.json"))}
    summary["ok"] = (all(v["rc"] == 0 for v in st.values()) and summary["gpu_suite"]["failed"] == 0
                     and summary["gpu_suite"]["errors"] == 0 and bool(summary["head"].get("within_bounds"))
                     and bool(summary["rl_loop"].get("resume_matched")))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", action="store_true", help="print the versions as one line: versions {json}")
    ap.add_argument("--out", help="tools/gpu_check.sh's OUT directory")
    ap.add_argument("--mode", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--stage", action="append", default=[], help="NAME:RC:WALL_S of a stage (repeat)")
    args = ap.parse_args(argv)
    if args.versions:
        print("versions " + json.dumps(versions()))
        return 0
    out = Path(args.out)
    summary = summarize(out, mode=args.mode, stages=args.stage)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    h, r = summary["head"], summary["rl_loop"]
    print(f"gpu_check ({args.mode}): suite {summary['gpu_suite']}; head {h.get('time_over_naive')} x naive, "
          f"within bounds {h.get('within_bounds')}; rl_loop tokens/s {r.get('tokens_per_s')}, MFU {r.get('mfu')}, "
          f"push {r.get('push_s')} s, resume matched {r.get('resume_matched')}; ok {summary['ok']}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
