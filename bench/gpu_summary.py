"""tools/gpu_check.sh's first and last step: the versions line, and summary.json from whatever the stages left.

    python3 bench/gpu_summary.py --versions                       # python, torch, CUDA, Triton, ... versions
    python3 bench/gpu_summary.py --out OUT --mode gpu             # OUT/summary.json from OUT/stages.jsonl ...

The script calls `--out` at each stage's start and end and from its exit trap, so summary.json always exists
and names what finished. summary.json: `mode`; `stages` (each stage of `STAGES`: `status` done / failed /
timed out / killed / running / not reached, with rc, limit and wall seconds; from OUT/stages.jsonl, one JSON line
per stage event); `versions` and `version_mismatches` (what lies outside `REHEARSED`, the versions the kit was
rehearsed on); `gpu_suite` (pytest's counts, or `summary_line: false` when pytest printed none); `head` (the
trainer's head call at the benchmarked shape, from OUT/head.jsonl: `error` against float64 with the GPU suite's
bounds, `time_over_naive` and `mem_over_naive`, and the 3xTF32 mode's time over naive when measured);
`rl_loop` (params dtype, steps, tokens/s, trainer MFU, push seconds, whether the resume matched;
bench/rl_loop.py, run A's figures as soon as run A is done); `ok`: every stage done, no suite test failed, the
head within the bounds and the resume matched.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HEAD_BOUNDS = {"err_loss_rel": 1e-4, "err_logp_abs": 1e-4, "err_grad_h_rel": 2e-5, "err_grad_w_rel": 2e-5}
"""tests/gpu/test_fused_logprob_gpu.py's bounds for FP32 inputs (the head benchmark's hidden states are FP32)."""
STAGES = ("versions", "install", "gpu_suite", "head", "rl_loop")
REHEARSED = {"python": ("3.11", "3.12"), "torch": ("2.11", "2.14.1"), "triton": ("3.6", "3.9"),
             "megatron-core": ("0.16.1", "0.19.2"), "cuda": ("13.0", "13.0")}
"""Inclusive version ranges the kit has run on: CPU rehearsals on Python 3.11 / torch 2.13 / megatron-core 0.16.1
and Python 3.12 / torch 2.14.1 / megatron-core 0.19.2 (Triton 3.9's interpreter), and the first H200 session's
Python 3.12 / torch 2.11 / Triton 3.6 / CUDA 13.0 (bench/results/2026-11-28_h200). A release is compared on the
range's number of components (torch 2.11.0+cu130 is 2.11). CUDA only in GPU mode."""
PACKAGES = ("torch", "triton", "numpy", "megatron-core", "transformers", "hydra-core", "omegaconf", "tokenizers")


def versions(*, with_torch: bool = True) -> dict[str, str | None]:
    """Python and the installed distributions' versions (metadata only: nothing heavy is imported but torch,
    for the CUDA version and the device, unless `with_torch` is False)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    if not with_torch:
        return out
    try:
        import torch

        out["cuda"] = torch.version.cuda
        out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        out["device"] = f"torch failed: {type(e).__name__}: {e}"
    return out


def pytest_counts(log: str) -> dict:
    """passed / failed / skipped / error counts of pytest's last summary line in `log`; when there is none (the
    suite was killed, or never started), `summary_line: False` and no counts, not zeros."""
    lines = [ln for ln in log.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)\b", ln)
             and re.search(r"\bin [\d.]+s\b", ln)]
    if not lines:
        return {"summary_line": False}
    counts = {"summary_line": True, "passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1]):
        counts["errors" if what.startswith("error") else what] = int(n)
    return counts


def _release(v: str, n: int) -> tuple[int, ...]:
    """The first `n` numeric components of a version string ('2.11.0+cu130' -> (2, 11) for n=2)."""
    parts = re.findall(r"\d+", v.split("+")[0])[:n]
    return tuple(int(p) for p in parts) + (0,) * (n - len(parts))


def version_mismatches(found: dict | None, *, mode: str) -> list[str]:
    """What in `found` (versions()) lies outside `REHEARSED`, one sentence each; CUDA only in GPU mode."""
    if not found:
        return ["no versions were recorded"]
    out = []
    for name, (lo, hi) in REHEARSED.items():
        if name == "cuda" and mode != "gpu":
            continue
        v = found.get(name)
        if v is None:
            out.append(f"{name}: not installed (rehearsed {lo} .. {hi})")
            continue
        n = max(len(lo.split(".")), len(hi.split(".")))
        if not _release(lo, n) <= _release(v, n) <= _release(hi, n):
            out.append(f"{name} {v} is outside the rehearsed {lo} .. {hi}")
    return out


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
    keys = ("device", "params", "params_dtype", "steps", "resumed_steps", "tokens_per_s", "train_tokens_per_s",
            "mfu", "trainer_tflops", "push_s", "resume_matched", "resume", "run_b")
    return {"measured": True, **{k: res.get(k) for k in keys}}


def _versions_of(path: Path) -> dict | None:
    """The `versions {json}` lines of versions.txt (`--versions`; the one after the install updates the
    packages), merged, or None."""
    lines = path.read_text().splitlines() if path.is_file() else []
    found = [json.loads(ln[len("versions "):]) for ln in lines if ln.startswith("versions {")]
    return {k: v for d in found for k, v in d.items()} if found else None


def _load(path: Path):
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except json.JSONDecodeError:
        return None


def _jsonl(path: Path) -> list[dict]:
    """The complete JSON lines of `path` (a line cut by a kill is left out)."""
    rows = []
    for ln in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(ln))
        except json.JSONDecodeError:
            continue
    return rows


def stage_table(events: list[dict]) -> dict[str, dict]:
    """Each of `STAGES` (and any other named in `events`) from its last event: status done / failed / timed out
    / killed / running / skipped, or not reached when it has none."""
    st: dict[str, dict] = {name: {"status": "not reached"} for name in STAGES}
    for ev in events:
        st[ev["stage"]] = {k: v for k, v in ev.items() if k != "stage"}
    return st


def summarize(out: Path, *, mode: str) -> dict:
    st = stage_table(_jsonl(out / "stages.jsonl"))
    suite_log = out / "gpu_suite.log"
    found = _versions_of(out / "versions.txt")
    summary = {"mode": mode, "stages": st, "versions": found,
               "version_mismatches": version_mismatches(found, mode=mode),
               "gpu_suite": pytest_counts(suite_log.read_text() if suite_log.is_file() else ""),
               "head": head_summary(_jsonl(out / "head.jsonl")), "rl_loop": rl_summary(_load(out / "rl_loop.json"))}
    suite = summary["gpu_suite"]
    summary["ok"] = (all(v["status"] in ("done", "skipped") for v in st.values()) and suite["summary_line"]
                     and suite["failed"] == 0 and suite["errors"] == 0 and bool(summary["head"].get("within_bounds"))
                     and bool(summary["rl_loop"].get("resume_matched")))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", action="store_true", help="print the versions as one line: versions {json}")
    ap.add_argument("--packages-only", action="store_true", help="with --versions: without importing torch")
    ap.add_argument("--out", help="tools/gpu_check.sh's OUT directory")
    ap.add_argument("--mode", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--quiet", action="store_true", help="write summary.json only (the script's interim calls)")
    args = ap.parse_args(argv)
    if args.versions:
        print("versions " + json.dumps(versions(with_torch=not args.packages_only)))
        return 0
    out = Path(args.out)
    summary = summarize(out, mode=args.mode)
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(out / "summary.json")  # a kill mid-write leaves the previous summary whole
    if args.quiet:
        return 0
    h, r = summary["head"], summary["rl_loop"]
    for line in summary["version_mismatches"]:
        print(f"gpu_check: version mismatch: {line}")
    stages = ", ".join(f"{k}: {v['status']}" for k, v in summary["stages"].items())
    print(f"gpu_check ({args.mode}): stages {stages}")
    print(f"gpu_check ({args.mode}): suite {summary['gpu_suite']}; head {h.get('time_over_naive')} x naive, "
          f"within bounds {h.get('within_bounds')}; rl_loop tokens/s {r.get('tokens_per_s')}, MFU {r.get('mfu')}, "
          f"push {r.get('push_s')} s, resume matched {r.get('resume_matched')}; ok {summary['ok']}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
