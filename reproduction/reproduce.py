"""`make reproduce`: the reproduction's two designs, run as resumable sweeps and analysed from their curves.

    python -m reproduction.reproduce sweep    --design predictability|loo [--sweep-dir D] [--seeds 0,1,2] [overrides]
    python -m reproduction.reproduce register --design predictability [--sweep-dir D] [--out D]
    python -m reproduction.reproduce analyse  --design predictability|loo [--sweep-dir D] [--out D] [--no-collect]

Designs (reproduction/README.md):
- `predictability`: the final recipe (conf/experiment/reproduction/predictability.yaml), 3 seeds x 6,400 steps;
  each run's first-half forecast is registered (`register`, then commit forecasts.json) before its second half
  is analysed (reproduction/predictability_analysis.py).
- `loo`: the paper's leave-one-out experiment at toy scale, 5 recipes x 3 seeds x 50 steps
  (conf/experiment/reproduction/loo_*.yaml; reproduction/loo_analysis.py).

`sweep` runs one Hydra multirun (reproduction/sweeps.py: seed-major, skip-done, resumable, every invocation
recorded); `analyse` collects the runs as curves into `<out>/runs/` (`--no-collect`: analyse the committed curves
alone, which regenerates the committed results byte for byte) and writes `<out>/results.json`, plots and the
generated section of `<out>/README.md`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from scalerl_mega.metrics.provenance import git_state


@dataclass(frozen=True, kw_only=True)
class Design:
    overlays: tuple[str, ...]
    """Its overlays in conf/experiment/reproduction/ (file stems = run names); the first is the reference."""
    sweep_dir: str
    out_dir: str


DESIGNS = {
    "predictability": Design(overlays=("predictability",), sweep_dir="outputs/reproduction/predictability",
                             out_dir="reproduction/predictability"),
    "loo": Design(overlays=("loo_scalerl", "loo_dapo", "loo_no_zvf", "loo_no_fp32_head", "loo_no_npr"),
                  sweep_dir="outputs/reproduction/loo", out_dir="reproduction/loo"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m reproduction.reproduce", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in (("sweep", "run (or continue) a design's sweep"),
                       ("register", "register the first-half forecasts of the runs past half their compute"),
                       ("analyse", "collect the runs as curves, fit, score, write the design's results")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--design", choices=sorted(DESIGNS) if name != "register" else ("predictability",),
                       default="predictability")
        s.add_argument("--sweep-dir", default=None, help="default: the design's own (outputs/reproduction/<design>)")
        if name == "sweep":
            s.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
            s.add_argument("--overlays", default=None,
                           help="comma-separated subset of the design's overlays (default: all of them)")
            s.add_argument("overrides", nargs="*", help="extra Hydra overrides for every point")
        else:
            s.add_argument("--out", default=None, help="default: the design's own (reproduction/<design>)")
        if name == "analyse":
            s.add_argument("--no-collect", action="store_true",
                           help="analyse <out>/runs as it is (the committed curves)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    design = DESIGNS[args.design]
    sweep_dir = Path(args.sweep_dir or design.sweep_dir)
    if args.cmd == "sweep":
        from reproduction.sweeps import run_sweep

        overlays = args.overlays.split(",") if args.overlays else list(design.overlays)
        unknown = sorted(set(overlays) - set(design.overlays))
        if unknown:
            print(f"reproduce sweep: error: --overlays {','.join(unknown)}: not an overlay of the {args.design} design "
                  f"({', '.join(design.overlays)})", file=sys.stderr)
            return 2
        return run_sweep(sweep_dir=sweep_dir, overlays=overlays, seeds=args.seeds, overrides=args.overrides)
    out_dir = Path(args.out or design.out_dir)
    try:
        if args.cmd == "register":
            from reproduction.predictability_analysis import register

            register(sweep_dir=sweep_dir, out_dir=out_dir, commit=git_state(Path.cwd())["commit"])
        elif args.design == "predictability":
            from reproduction.predictability_analysis import analyse

            analyse(sweep_dir=None if args.no_collect else sweep_dir, out_dir=out_dir)
        else:
            from reproduction.loo_analysis import analyse

            analyse(sweep_dir=None if args.no_collect else sweep_dir, out_dir=out_dir)
    except ValueError as e:
        print(f"reproduce {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
