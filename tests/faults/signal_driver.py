"""`scalerl-train` with a signal sent at a known point (tests/faults/test_sigint.py): the interleaving is forced by
a hook, not by timing.

    python tests/faults/signal_driver.py <phase> <step> <signal> <count> [overrides...]

phase `rl`: after RL step <step> is logged (the loop's `on_step`); phase `sft`: after SFT step <step>. The signal
(INT or TERM) goes <count> times to the run's whole process group, as a terminal's Ctrl-C or Slurm would send it.
"""

from __future__ import annotations

import os
import signal
import sys


def _send(sig: signal.Signals, count: int) -> None:
    for _ in range(count):
        os.killpg(os.getpgid(0), sig)


def main() -> None:
    phase, step, name, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    sig = signal.Signals[f"SIG{name}"]
    sys.argv = [sys.argv[0], *sys.argv[5:]]
    if phase == "rl":
        import scalerl_mega.loop as loop

        real = loop.run_rl

        def run_rl(cfg, comps, **kw):
            def on_step(s, rec):
                if s == step:
                    print(f"driver: sending SIG{name} x{count} after RL step {s}", flush=True)
                    _send(sig, count)

            return real(cfg, comps, **kw, on_step=on_step)

        loop.run_rl = run_rl
    elif phase == "sft":
        import scalerl_mega.sft as sft

        real_ws = sft.warm_start

        def warm_start(trainer, examples, **kw):
            inner = kw.pop("on_step", None)

            def on_step(s, m):
                if inner is not None:
                    inner(s, m)
                if s == step:
                    print(f"driver: sending SIG{name} x{count} after SFT step {s}", flush=True)
                    _send(sig, count)

            return real_ws(trainer, examples, **kw, on_step=on_step)

        sft.warm_start = warm_start
    else:
        raise SystemExit(f"unknown phase {phase!r}")
    from scalerl_mega.train import main as train_main

    train_main()


if __name__ == "__main__":
    main()
