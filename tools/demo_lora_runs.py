"""Run `experiment=demo_lora` (LoRA RL, adapter-only weight sync) for seeds 0, 1, 2 one after another on the demo's
own warm start, and summarise them into docs/demo_lora_runs.json and docs/demo_lora_runs.png.

    .venv/bin/python tools/demo_lora_runs.py --out outputs/demo_lora_runs                  # base, runs, summary
    .venv/bin/python tools/demo_lora_runs.py --out DIR --summarise-only                    # existing run dirs

The base is made once: `experiment=demo seed=0 train.steps=1 sft.checkpoint=DIR/base_sft` (the full-model warm
start of `make demo`, saved), converted to HF by tools/convert_megatron_to_hf.py into DIR/base_hf. Each run is
`nice -n 5 scalerl-train experiment=demo_lora seed=S init_from_hf=DIR/base_hf` (the machine is shared: the 1-minute
load average is recorded before and after). Per run: every validation's step and pass rate (metrics.jsonl), the gain
of the last over the first, the bytes each step's push sent (`sync/bytes`) against the bytes of the whole model
(the base checkpoint's tensors: what a full push sends), and wall seconds. The revision is `git describe --always
--dirty`. No figure is typed in by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from demo_multiturn_runs import load_average, revision, save_figure  # tools/ is the script's own directory

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
TRAIN = str(ROOT / ".venv/bin/scalerl-train")


def _run(cmd: list[str], log: Path) -> int:
    with open(log, "w") as out:
        return subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode


def make_base(out: Path) -> Path:
    """DIR/base_hf: the demo's seed-0 warm start as an HF checkpoint (made once)."""
    hf = out / "base_hf"
    if (hf / "config.json").is_file():
        return hf
    run_dir = out / "base"
    run_dir.mkdir(parents=True, exist_ok=True)
    rc = _run(["nice", "-n", "5", TRAIN, "experiment=demo", "seed=0", "train.steps=1", "train.val_every=0",
               "train.save_every=0", f"sft.checkpoint={out / 'base_sft'}", f"output_dir={run_dir}",
               f"hydra.run.dir={run_dir}"], run_dir / "console.txt")
    if rc != 0:
        raise SystemExit(f"the base warm start failed (exit {rc}): {run_dir / 'console.txt'}")
    rc = _run([sys.executable, str(ROOT / "tools/convert_megatron_to_hf.py"), "--ckpt", str(out / "base_sft"),
               "--out", str(hf), "--no-progress"], out / "convert.txt")
    if rc != 0:
        raise SystemExit(f"converting the base failed (exit {rc}): {out / 'convert.txt'}")
    return hf


def command(seed: int, run_dir: Path, base: Path) -> list[str]:
    return ["nice", "-n", "5", TRAIN, "experiment=demo_lora", f"seed={seed}", f"init_from_hf={base}",
            f"output_dir={run_dir}", f"hydra.run.dir={run_dir}"]


def launch(seed: int, run_dir: Path, base: Path) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    rec = {"seed": seed, "launched_unix": time.time(), "load_before": load_average()}
    rc = _run(command(seed, run_dir, base), run_dir / "console.txt")
    rec.update(load_after=load_average(), exit_status=rc, finished_unix=time.time())
    (run_dir / "launch.json").write_text(json.dumps(rec) + "\n")
    return rec


def model_bytes(hf: Path) -> int:
    """Bytes of every tensor of an HF checkpoint (what a full weight push sends at its dtype)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(hf.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                t = st.get_slice(name)
                n = 1
                for s in t.get_shape():
                    n *= int(s)
                total += n * {"F32": 4, "BF16": 2, "F16": 2}[t.get_dtype()]
    return total


def summarise(run_dir: Path, *, full_bytes: int) -> dict:
    launch_rec = json.loads((run_dir / "launch.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    val = [{"step": r["step"], "pass_rate": r["val_pass_rate"]} for r in rows if r["kind"] == "validation"]
    sync = sorted({int(r["sync/bytes"]) for r in rows if r["kind"] == "train" and "sync/bytes" in r})
    first, last = val[0]["pass_rate"], val[-1]["pass_rate"]
    return {
        "seed": launch_rec["seed"], "exit_status": launch_rec["exit_status"],
        "load_before": launch_rec["load_before"], "load_after": launch_rec["load_after"],
        "first": first, "last": last, "gain": round(last - first, 4),
        "max_gain": round(max(p["pass_rate"] for p in val) - first, 4),
        "sync_bytes_per_step": sync, "full_model_bytes": full_bytes,
        "sync_fraction_of_full": [round(s / full_bytes, 5) for s in sync],
        "wall_s": round(launch_rec["finished_unix"] - launch_rec["launched_unix"], 1), "validations": val,
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for r in runs:
        steps, rates = zip(*((p["step"], p["pass_rate"]) for p in r["validations"]))
        ax.plot(steps, rates, marker="o", label=f"seed {r['seed']}: {r['first']:.2f} -> {r['last']:.2f}")
    ax.set(xlabel="RL step", ylabel="validation pass rate", title="experiment=demo_lora (rank-8 LoRA), 3 seeds")
    save_figure(fig, [ax], path, legend_title="adapter-only sync")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the runs' parent (DIR/base_hf, DIR/seed0, ...)")
    p.add_argument("--summarise-only", action="store_true", help="summarise existing run directories")
    args = p.parse_args(argv)
    json_path, png_path, rev = ROOT / "docs/demo_lora_runs.json", ROOT / "docs/demo_lora_runs.png", revision()
    base = args.out / "base_hf"
    if not args.summarise_only:
        base = make_base(args.out)
        for seed in SEEDS:
            launch(seed, args.out / f"seed{seed}", base)
        (args.out / "revision.txt").write_text(rev + "\n")
    rev_file = args.out / "revision.txt"
    full = model_bytes(base)
    runs = [summarise(args.out / f"seed{s}", full_bytes=full) for s in SEEDS]
    doc = {"revision": rev_file.read_text().strip() if rev_file.is_file() else rev,
           "command": "scalerl-train experiment=demo_lora seed=<S> init_from_hf=<out>/base_hf (tools/demo_lora_runs.py)",
           "machine": "2 CPU cores shared with other developers' jobs (load average recorded per run)", "runs": runs}
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    plot(runs, png_path)
    print(json.dumps({r["seed"]: {k: r[k] for k in ("first", "last", "gain", "sync_bytes_per_step", "wall_s")}
                      for r in runs}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
