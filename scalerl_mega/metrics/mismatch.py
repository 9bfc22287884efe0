"""The generator-vs-trainer mismatch of a run whose generator runs in another precision (`rollout.quantization=fp8`),
summarised from its train metrics records for report.md and the docs' demo figures.

On-policy tokens (sampled by the weights the trainer holds) carry only the precision gap: their log-ratio
log pi_train - log pi_gen is the FP8 generator's own error. Per step the trainer logs the k3 estimate of
KL(pi_gen || pi_train) per on-policy token (`rollout/mismatch_kl`), the sum and max of |log-ratio| over those tokens
and their count (`train/onpolicy_abs_log_ratio_sum`, `_max`, `train/onpolicy_tokens`), the share of trained tokens
whose IS weight the loss truncates or clips (`train/clip_fraction`: CISPO's sg(min(rho, eps_high)) is a truncated IS
weight, paper Sec. 3.2), and the share of units an explicit correction truncated or masked
(`train/is_correction_fraction`, `loss.is_correction`: TIS / MIS); over all trained tokens, the same k3 KL
(`train/approx_kl`) and the mean |log-ratio|, which add the samples' staleness to the gap. On-policy figures weight
each step by its on-policy tokens; the others are plain means over steps. Pure text and arithmetic, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

CORRECTIONS = {"none": "no correction beyond the loss's own IS weight",
               "tis_token": "truncated IS per token", "tis_seq": "truncated IS per sequence",
               "mis_token": "masked IS per token (IcePop)", "mis_seq": "masked IS per sequence"}


def _mean_max(rows: Sequence[Mapping[str, float]], key: str) -> tuple[float, float] | None:
    vals = [float(r[key]) for r in rows if key in r]
    return (sum(vals) / len(vals), max(vals)) if vals else None


def mismatch_summary(train: Sequence[Mapping[str, float]]) -> dict[str, float] | None:
    """Run-level mismatch figures (module doc); None when no step trained tokens. On-policy tokens (the FP8 gap
    alone; None-free only when some step saw one): onpolicy_steps, onpolicy_tokens, onpolicy_kl (token-weighted
    mean), onpolicy_kl_max, onpolicy_abs_log_ratio_mean (token-weighted), onpolicy_abs_log_ratio_max. All trained
    tokens (the gap plus staleness, PipelineRL's samples being up to k versions old): kl_mean / kl_max
    (`train/approx_kl`, the same k3), abs_log_ratio_mean / _max (`train/abs_log_ratio_mean` per step), rho_max,
    clip_fraction_mean / _max, is_correction_fraction_mean / _max when logged; sync_bytes: the last push's."""
    rows = [r for r in train if "train/approx_kl" in r]
    if not rows:
        return None
    out: dict[str, float] = {"steps": float(len(rows))}
    for name, key in (("kl", "train/approx_kl"), ("abs_log_ratio", "train/abs_log_ratio_mean"),
                      ("clip_fraction", "train/clip_fraction"), ("is_correction_fraction", "train/is_correction_fraction")):
        mm = _mean_max(rows, key)
        if mm is not None:
            out[f"{name}_mean"], out[f"{name}_max"] = mm
    if any("train/rho_max" in r for r in rows):
        out["rho_max"] = max(float(r["train/rho_max"]) for r in rows if "train/rho_max" in r)
    on = [r for r in rows if r.get("train/onpolicy_tokens") and "rollout/mismatch_kl" in r]
    if on:
        tokens = sum(float(r["train/onpolicy_tokens"]) for r in on)
        out.update(onpolicy_steps=float(len(on)), onpolicy_tokens=tokens,
                   onpolicy_kl=sum(float(r["rollout/mismatch_kl"]) * float(r["train/onpolicy_tokens"]) for r in on)
                   / tokens, onpolicy_kl_max=max(float(r["rollout/mismatch_kl"]) for r in on),
                   onpolicy_abs_log_ratio_mean=sum(float(r["train/onpolicy_abs_log_ratio_sum"]) for r in on) / tokens,
                   onpolicy_abs_log_ratio_max=max(float(r["train/onpolicy_abs_log_ratio_max"]) for r in on))
    pushes = [float(r["sync/bytes"]) for r in train if r.get("sync/bytes")]
    if pushes:
        out["sync_bytes"] = pushes[-1]
    return out


def _cell(s: Mapping[str, float], name: str) -> str:
    """"mean (worst step: max)" of `name`, or "-"."""
    return f"{s[name + '_mean']:.3g} (worst step {s[name + '_max']:.3g})" if name + "_mean" in s else "-"


def report_lines(train: Sequence[Mapping[str, float]], *, quantization: str, is_correction: str) -> list[str]:
    """report.md's section on the generator's precision gap (module doc); [] for an unquantized generator."""
    if quantization == "none":
        return []
    s = mismatch_summary(train)
    q = quantization.upper()
    lines = [f"## Generator in {q}: the mismatch (rollout.quantization={quantization})", "",
             f"The generator samples with blockwise {q} weights, the trainer scores in its own precision. On on-policy "
             "tokens (sampled by the weights the trainer holds) the gap is the generator's own; over all trained "
             "tokens it adds the samples' staleness. IS correction: loss.is_correction="
             f"{is_correction} ({CORRECTIONS.get(is_correction, is_correction)}).", ""]
    if s is None:
        return lines + ["No step trained a token: no mismatch measured.", ""]
    on = "onpolicy_kl" in s
    lines += ["| figure | on-policy tokens (the precision gap) | all trained tokens (mean over steps) |",
              "|---|---|---|",
              f"| KL(pi_gen, pi_train) per token (k3) | "
              + (f"{s['onpolicy_kl']:.3g} (worst step {s['onpolicy_kl_max']:.3g})" if on else "-") + f" | {_cell(s, 'kl')} |",
              "| mean abs log-ratio | "
              + (f"{s['onpolicy_abs_log_ratio_mean']:.3g} (largest token {s['onpolicy_abs_log_ratio_max']:.3g})" if on
                 else "-")
              + f" | {_cell(s, 'abs_log_ratio')} |",
              f"| share of tokens whose IS weight the loss truncates (clip fraction) | - | {_cell(s, 'clip_fraction')} |"]
    if "is_correction_fraction_mean" in s:
        lines.append(f"| share of units {is_correction} truncated or masked | - | "
                     f"{_cell(s, 'is_correction_fraction')} |")
    where = (f"{s['onpolicy_tokens']:.0f} on-policy tokens in {s['onpolicy_steps']:.0f} step(s)" if on
             else "no on-policy token")
    lines += ["", f"Over {s['steps']:.0f} steps; {where}."
              + (f" Largest IS ratio pi_train / pi_gen: {s['rho_max']:.3g}." if "rho_max" in s else "")
              + (f" Bytes per weight push: {s['sync_bytes']:.0f}." if "sync_bytes" in s else "")]
    return lines + [""]
