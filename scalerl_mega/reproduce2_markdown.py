"""The generated section of reproduction/repro3/README.md, from `reproduce2_analyse.analyse2`'s results."""

from __future__ import annotations

from typing import Any

from scalerl_mega.reproduce2_report import EXPECTED_SEEDS, REFERENCE, SETTINGS
from scalerl_mega.reproduce_report import BEGIN, END, FINAL_POINTS, fmt


def _commit(record: dict[str, Any]) -> str:
    return (record.get("commit") or "?")[:10] + (" (dirty)" if record.get("dirty") else "")


def _trained_by(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The invocations that trained a run: its provenance segments, or (runs stamped before segments were
    recorded) the invocation that finished it."""
    return run.get("segments") or [run]


def _status(results: dict[str, Any]) -> list[str]:
    runs = results["runs"]
    done = {rec: sorted(int(k.split("/seed")[1]) for k in runs if k.split("/seed")[0] == rec) for rec in SETTINGS}
    lines = ["| setting | what | seeds finished | commit(s) |", "|---|---|---|---|"]
    for rec, st in SETTINGS.items():
        commits = sorted({_commit(seg) for s in done[rec] for seg in _trained_by(runs[f"{rec}/seed{s}"])})
        lines.append(f"| {rec} | {st.title} | {len(done[rec])} of {len(EXPECTED_SEEDS)}"
                     f"{' (' + ', '.join(map(str, done[rec])) + ')' if done[rec] else ''} | "
                     f"{', '.join(commits) or '-'} |")
    resumed = [f"{k} ({', '.join(f'steps {a}-{b} at {_commit(g)}' for g in r['segments'] for a, b in [g['steps']])})"
               for k, r in runs.items() if len({_commit(g) for g in r.get("segments") or []}) > 1]
    if resumed:
        lines += ["", "Trained by more than one commit (resumed from a checkpoint; `provenance.json`'s segments): "
                  + "; ".join(resumed) + "."]
    odd = [f"{k}: {'; '.join(r['irregular_points'])}" for k, r in runs.items() if r.get("irregular_points")]
    if odd:
        lines += ["", "Validation points off the schedule (each is fitted with its own sample count): " + ". ".join(odd)
                  + "."]
    if results["missing"]:
        lines += ["", f"**Partial sweep**: {len(results['missing'])} run(s) not finished: "
                  + ", ".join(results["missing"]) + ". `make reproduce` continues it (finished runs are skipped, "
                  "an interrupted one resumes from its last checkpoint)."]
    return lines


def _predictability(results: dict[str, Any]) -> list[str]:
    lines = ["| run | first-half fit (A, 95% interval) | forecast at the last 3 points | observed | mean abs error | "
             "noise floor | error / floor | unvetted fit's error |", "|---|---|---|---|---|---|---|---|"]
    for k, r in results["runs"].items():
        h = r["half_fit"]
        pred = ", ".join(f"{v:.3f}" for v in h["predicted"]) if h["predicted"] else "no forecast"
        lines.append(f"| {k} | {h['verdict']} | {pred} | {', '.join(f'{v:.3f}' for v in h['observed'])} | "
                     f"{fmt(h['mae'], '.3f')} | {h['noise_floor']:.3f} | {fmt(h['ratio'], '.2f')} | "
                     f"{h['unvetted_mae']:.3f} |")
    ok = [r["half_fit"] for k, r in results["runs"].items() if k.startswith(f"{REFERENCE}/")]
    ident = [h for h in ok if h["identified"]]
    lines += ["", f"Reference recipe: the first half identified A for {len(ident)} of {len(ok)} seed(s)"
              + (f"; forecast error at the last {FINAL_POINTS} points / noise floor: "
                 + ", ".join(f"{h['ratio']:.2f}" for h in ident) if ident else "") + "."]
    return lines


def _runs(results: dict[str, Any]) -> list[str]:
    lines = ["| run | A | A 95% interval | B | C_mid (k samples) | identified | B at common A | last pass rate | "
             "residual SD / binomial SE | epoch at end | prompts left in the pool | steps | wall s |",
             "|" + "---|" * 13]
    for k, r in results["runs"].items():
        iv, od = r["A_interval"], r["overdispersion"]
        lines.append(f"| {k} | {fmt(r['A'], '.3f')} | {fmt(iv[0], '.3f')}..{fmt(iv[1], '.3f')} | "
                     f"{fmt(r['B'], '.2f')} | "
                     f"{fmt(r['C_mid'], '.4g')} | {'yes' if r['identified'] else 'NO'} | "
                     f"{fmt(r['B_at_common_A'], '.2f')} | {r['last_val_pass_rate']:.3f} | "
                     f"{od['residual_sd']:.4f} / {od['binomial_se']:.4f} = {od['ratio']:.1f} | "
                     f"{fmt(r['epoch_at_end'], 'd')} | {fmt(r['active_prompts_at_end'], '.0f')} | "
                     f"{fmt(r['steps'], 'd')} | {fmt(r['wall_s'], '.0f')} |")
    un = [f"- {k}: {r['reason']}" for k, r in results["runs"].items() if not r["identified"]]
    return lines + (["", "Not identified (whole run):", ""] + un if un else [])


def _paired(p: dict[str, Any]) -> str:
    return f"{p['outcome']} ({fmt(p['mean'], '+.3f')} +- {fmt(p['half_width'], '.3f')}, {len(p['seeds'])} seeds)"


def _comparisons(results: dict[str, Any]) -> list[str]:
    lines = ["| variant vs reference | paper | paper's rule (A within +-0.02, then B at the common A) | paired final "
             f"pass rate (last {FINAL_POINTS} points, t 95%) | early window | late window | curves |",
             "|---|---|---|---|---|---|---|"]
    for name, row in results["comparisons"].items():
        var, ref = row["variant"], row["reference"]
        paper = SETTINGS[var].paper if name != "batch_large_vs_small" else SETTINGS["batch_large"].paper
        if "incomplete" in row:
            lines.append(f"| {var} vs {ref} | {paper} | **incomplete**: {row['incomplete']} | - | - | - | - |")
            continue
        cr = row["crossing"]
        lines.append(f"| {var} vs {ref} | {paper} | {row['rule']['outcome']}: {row['rule']['reason']} | "
                     f"{_paired(row['final'])} | {_paired(cr['early'])} | {_paired(cr['late'])} | "
                     f"**{cr['outcome']}** |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = [BEGIN, "", "### Status", ""] + _status(results)
    lines += ["", "### Predictability: fit the first half, forecast the end (paper Fig. 1, Sec. 6)", "",
              "Each run's validation points up to half its compute are fitted with Eq. 1 by the project's "
              "identification rule (`scaling.identify`); where A is identified the fit is extrapolated to the run's "
              f"last {FINAL_POINTS} points. Noise floor: sqrt(2/pi) x the mean binomial SE of those points (the mean "
              "absolute error a perfect forecast would still show). Unvetted fit's error: the same first-half fit used "
              "as a forecast regardless of the rule (what the rule protects against where it refuses).", ""]
    lines += _predictability(results)
    lines += ["", "### Whole-run fits (compute = generated samples)", "",
              f"B at the common A: every run refit at the mean A of the identified runs "
              f"(A = {fmt(results['common_A'], '.3f')}; paper App. A.5)."] + [""] + _runs(results)
    lines += ["", "### Comparisons", "",
              "Windows: the paired difference (variant - reference, per seed, then the t rule over seeds) averaged "
              "over the first and the last quarter of the common compute; *crossed* = the variant significantly "
              "below early and above late; 'reference' is the setting after 'vs'. The control's row is what seeds and "
              "numerics alone produce; the rows against `batch_control` repeat a variant's comparison against that "
              "rerun of the reference recipe (a real effect shows against both).", ""]
    lines += _comparisons(results)
    lines += ["", "### Plots", ""] + [f"![{p}]({p})" for p in results["plots"]] + ["", END]
    return "\n".join(lines)
