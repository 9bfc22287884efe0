"""The paper's scaling figures (Fig. 1, 2, 7): PNG and SVG with matplotlib's Agg canvas.

Conventions (Fig. 2 caption): evaluation points are stars, the fitted curve is solid over the range used
for fitting and dashed where it extrapolates (dotted, thin, below the fit window), points held out of the
fit are crosses; several runs share one axis with A annotated (in the legend, and a dotted line at each
identified A). With an `identify.Assessment` attached, A's 95% interval is a shaded band, the fit cut a
vertical dotted line, and a curve whose A is not identified is drawn over its data only (no
extrapolation: no forecast without an identified A). `plot_loo` draws Fig. 7's log F vs log C.

No pyplot: figures are built with `matplotlib.figure.Figure` and an explicit Agg canvas inside the
functions, so importing this module or plotting never touches global backend state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from scalerl_mega.scaling.band import Band
from scalerl_mega.scaling.fit import SigmoidFit, loo_transform, sigmoid_law
from scalerl_mega.scaling.identify import Assessment

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass(frozen=True, kw_only=True)
class CurvePlot:
    """One run on a scaling plot."""

    label: str
    compute: Sequence[float]
    reward: Sequence[float]
    fit: SigmoidFit
    heldout_from: float | None = None
    """Points with compute above this were held out of the fit: drawn as crosses."""
    assessment: Assessment | None = None
    """The verdict of `identify.assess` for `fit`: band, cut line and identification come from it."""
    band: Band | None = None
    """The 95% forecast band (`scaling.band`) over its computes beyond the fitted data: drawn shaded, with the
    forecast dashed, whether or not A is identified."""
    y_range: tuple[float, float] | None = None
    """`scalerl-fit --y-range LO HI`: `reward` and `fit` are on (y - LO) / (HI - LO); the y axis and the legend's
    A values are labelled in the metric's units LO + (HI - LO) v."""

    def units(self, v: float) -> float:
        """A value of the fitted 0-1 scale in the metric's units."""
        return v if self.y_range is None else self.y_range[0] + (self.y_range[1] - self.y_range[0]) * v


def short_number(v: float) -> str:
    """A compute value for a legend or a tick: 3 significant digits, no trailing zeros (0.006981 -> 0.00698)."""
    return f"{v:.3g}"


def _log_ticks(ax) -> None:
    """Readable log-axis ticks: labels at 1, 2, 5 x 10^k over at most two decades, at powers of ten beyond; no
    minor-tick labels (matplotlib labels minor ticks on short ranges, where they overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = ax.get_xlim()
    decades = math.log10(max(hi, 1e-300) / max(lo, 1e-300))
    subs = (1.0, 2.0, 5.0) if decades <= 2.0 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10.0, subs=subs, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: short_number(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _new_figure(figsize: tuple[float, float], dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path, formats: Sequence[str], dpi: int) -> list[Path]:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt in formats:
        if fmt not in ("png", "svg"):
            raise ValueError(f"plot format must be 'png' or 'svg', got {fmt!r}")
        target = p.with_suffix("." + fmt)
        fig.savefig(target, format=fmt, dpi=dpi)
        out.append(target)
    return out


def plot_scaling(curves: Sequence[CurvePlot], *, path: str | Path, formats: Sequence[str] = ("png", "svg"),
                 title: str | None = None, xlabel: str = "Compute (GPU-hours)", ylabel: str = "Validation pass rate",
                 log_x: bool = True, extend_to: float | None = None, figsize: tuple[float, float] = (8.0, 5.0),
                 dpi: int = 100) -> list[Path]:
    """Reward vs compute for one or more runs; writes `path` with each suffix in `formats`, returns the files.

    The image is figsize x dpi pixels (default 800 x 500). The curve extends to `extend_to` (default: the
    largest compute shown)."""
    fig = scaling_figure(curves, title=title, xlabel=xlabel, ylabel=ylabel, log_x=log_x, extend_to=extend_to,
                         figsize=figsize, dpi=dpi)
    return _save(fig, path, formats, dpi)


def scaling_figure(curves: Sequence[CurvePlot], *, title: str | None = None, xlabel: str = "Compute (GPU-hours)",
                   ylabel: str = "Validation pass rate", log_x: bool = True, extend_to: float | None = None,
                   figsize: tuple[float, float] = (8.0, 5.0), dpi: int = 100):
    """The matplotlib Figure `plot_scaling` saves (tests read its artists)."""
    if not curves:
        raise ValueError("plot_scaling needs at least one curve")
    fig = _new_figure(figsize, dpi)
    ax = fig.add_subplot(1, 1, 1)
    c_all = np.concatenate([np.asarray(cv.compute, dtype=np.float64) for cv in curves])
    pos = c_all[c_all > 0]
    c_min = float(pos.min()) if pos.size else 1.0
    c_max = max(float(c_all.max()), extend_to or 0.0)
    y_top = -math.inf
    for k, cv in enumerate(curves):
        y_top = _draw_curve(ax, cv, color=_COLORS[k % len(_COLORS)], c_min=c_min, c_max=c_max, log_x=log_x,
                            single=len(curves) == 1, y_top=y_top)
    lo_y, hi_y = ax.get_ylim()
    ax.set_ylim(lo_y, max(hi_y, y_top + 0.04 * (y_top - lo_y)))
    if log_x:
        ax.set_xscale("log")
        _log_ticks(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if curves[0].y_range is not None:  # drawn on the fitted 0-1 scale, labelled in the metric's units
        from matplotlib.ticker import FuncFormatter

        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{curves[0].units(v):.3g}"))
    if title:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _draw_curve(ax, cv: CurvePlot, *, color: str, c_min: float, c_max: float, log_x: bool, single: bool,
                y_top: float) -> float:
    """Draw one run of `plot_scaling` (fitted curve, extrapolation, A band and line, points, held-out points);
    returns `y_top` raised to its A (if identified) and its highest reward."""
    c = np.asarray(cv.compute, dtype=np.float64)
    r = np.asarray(cv.reward, dtype=np.float64)
    f = cv.fit
    held = c > cv.heldout_from if cv.heldout_from is not None else np.zeros(c.shape, dtype=bool)
    shown = c > 0 if log_x else np.ones(c.shape, dtype=bool)
    lo, hi = f.compute_range
    grid_lo = c_min if log_x else 0.0
    xs_in = np.geomspace(lo, hi, 200) if lo > 0 else np.linspace(lo, hi, 200)
    a = cv.assessment
    identified = f.identified if a is None else a.identified
    u = cv.units
    if identified:
        label = f"{cv.label}: A={u(f.A):.3f}, B={f.B:.2f}, C_mid={f.C_mid:.4g}"
    else:
        label = f"{cv.label}: A not identified"
    if a is not None:
        a_lo, a_hi = a.A_interval
        label = label.replace(f"A={u(f.A):.3f}", f"A={u(f.A):.3f} [{u(a_lo):.3f}, {u(a_hi):.3f}]") if identified \
            else f"{label} (95% interval {u(a_lo):.3f}..{u(a_hi):.3f})"
        ax.axhspan(a_lo, a_hi, color=color, alpha=0.12, lw=0, zorder=1)
        if a.fit_from is not None and (a.fit_from > 0 or not log_x):
            ax.axvline(a.fit_from, color=color, lw=0.9, ls=":", alpha=0.8, zorder=2,
                       label=f"{cv.label}: points before {short_number(a.fit_from)} not fitted")
    ax.plot(xs_in, f.predict(xs_in), "-", color=color, lw=2.0, label=label, zorder=3)
    if cv.band is not None:
        b = cv.band
        beyond = b.compute >= hi
        ax.fill_between(b.compute[beyond], b.lo[beyond], b.hi[beyond], color=color, alpha=0.18, lw=0, zorder=2,
                        label=f"{cv.label}: forecast, 95% band")
        ax.plot(b.compute[beyond], b.reward[beyond], "--", color=color, lw=1.8, zorder=3)
        y_top = max(y_top, float(np.max(b.hi[beyond], initial=-math.inf)))
    elif c_max > hi and identified:
        xs_out = np.geomspace(hi, c_max, 120) if log_x else np.linspace(hi, c_max, 120)
        ax.plot(xs_out, f.predict(xs_out), "--", color=color, lw=1.8, zorder=3,
                label=f"{cv.label}: extrapolated" if single else None)
    if lo > grid_lo:
        xs_pre = np.geomspace(grid_lo, lo, 60) if log_x else np.linspace(grid_lo, lo, 60)
        ax.plot(xs_pre, f.predict(xs_pre), ":", color=color, lw=1.0, alpha=0.6)
    m = shown & ~held
    ax.plot(c[m], r[m], "*", color=color, ms=7, alpha=0.85, linestyle="none")
    if held.any():
        ax.plot(c[held & shown], r[held & shown], "x", color=color, ms=6, mew=1.3, alpha=0.6, linestyle="none",
                label=f"{cv.label}: held out")
    if identified:
        ax.axhline(f.A, color=color, lw=0.9, ls=(0, (1, 3)), alpha=0.9)
        y_top = max(y_top, f.A)
    y_top = max(y_top, float(r.max()))
    return y_top


def plot_loo(curves: Sequence[CurvePlot], *, path: str | Path, formats: Sequence[str] = ("png", "svg"),
             A: float | None = None, title: str | None = None, figsize: tuple[float, float] = (8.0, 5.0),
             dpi: int = 100) -> list[Path]:
    """Fig. 7: log F(R) vs log C per run with the line of slope B. Each run uses its curve's fit (A, B, C_mid,
    R0); the paper refits all runs at their common mean A first: pass the `compare.compare_loo` refits
    (`LooRun.fixed` with its B and C_mid), as `scalerl-fit --plot-dir` does."""
    if not curves:
        raise ValueError("plot_loo needs at least one curve")
    fig = _new_figure(figsize, dpi)
    ax = fig.add_subplot(1, 1, 1)
    for k, cv in enumerate(curves):
        color = _COLORS[k % len(_COLORS)]
        f = cv.fit
        a = f.A if A is None else A
        t = loo_transform(cv.compute, cv.reward, A=a, B=f.B, C_mid=f.C_mid, R0=f.R0)
        lo, hi = f.compute_range
        v = t.valid & (np.exp(np.nan_to_num(t.log_C, nan=-np.inf)) >= lo)
        ax.plot(t.log_C[v], t.log_F[v], "*", color=color, ms=6, alpha=0.8, linestyle="none")
        if v.any():
            xs = np.linspace(float(t.log_C[v].min()), float(t.log_C[v].max()), 50)
            ax.plot(xs, f.B * xs, "-", color=color, lw=1.8, label=f"{cv.label}: B={f.B:.2f}")
    ax.set_xlabel("log C")
    ax.set_ylabel("log F(R)")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    fig.tight_layout()
    return _save(fig, path, formats, dpi)


def figure_size_px(figsize: tuple[float, float], dpi: int) -> tuple[int, int]:
    """Pixel size of a PNG written with `figsize` inches at `dpi` (no bbox cropping is used)."""
    return (int(math.floor(figsize[0] * dpi + 0.5)), int(math.floor(figsize[1] * dpi + 0.5)))


@dataclass(frozen=True, kw_only=True)
class BandCurve:
    """A mean curve with a shaded band (e.g. a seed mean +- 2 SE), drawn by `plot_bands`."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    lo: Sequence[float]
    hi: Sequence[float]


@dataclass(frozen=True, kw_only=True)
class BandPanel:
    title: str
    ylabel: str
    curves: Sequence[BandCurve]
    zero_line: bool = False
    """Draw y = 0 (a panel of differences)."""


def plot_bands(panels: Sequence[BandPanel], *, path: str | Path, xlabel: str, title: str | None = None,
               formats: Sequence[str] = ("png",), figsize: tuple[float, float] | None = None,
               dpi: int = 100) -> list[Path]:
    """Side-by-side panels of mean curves with bands on a shared linear x axis (e.g. seed-mean validation
    curves, and the paired difference of two settings with its t band: where two curves cross)."""
    if not panels or any(not p.curves for p in panels):
        raise ValueError("plot_bands needs at least one panel, each with at least one curve")
    fig = _new_figure(figsize or (6.0 * len(panels), 4.5), dpi)
    for k, panel in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        for j, cv in enumerate(panel.curves):
            color = _COLORS[j % len(_COLORS)]
            x = np.asarray(cv.x, dtype=np.float64)
            ax.fill_between(x, np.asarray(cv.lo, dtype=np.float64), np.asarray(cv.hi, dtype=np.float64),
                            color=color, alpha=0.18, lw=0)
            ax.plot(x, np.asarray(cv.y, dtype=np.float64), "-o", color=color, ms=2.5, lw=1.4, label=cv.label)
        if panel.zero_line:
            ax.axhline(0.0, color="black", lw=0.8)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path, formats, dpi)


@dataclass(frozen=True, kw_only=True)
class ForecastPanel:
    """One run fitted on its first part and scored on the rest (paper Fig. 1): the points, +- 2 binomial SE."""

    title: str
    compute: Sequence[float]
    reward: Sequence[float]
    n_samples: Sequence[float]
    fitted_to: float
    """Points at or below this compute were fitted; the rest are drawn as observed after the forecast."""
    params: dict[str, float]
    """Eq. 1's A, B, C_mid, R0 of the fit."""
    A_interval: tuple[float, float] | None
    """A's 95% interval (its band is drawn); None: no band."""
    identified: bool = True
    """A is identified: the fit is the forecast (solid); otherwise there is no forecast and the fit and its band
    are drawn dashed and lighter."""
    extend_to: float | None = None


def plot_forecasts(panels: Sequence[ForecastPanel], *, path: str | Path, xlabel: str, title: str,
                   ylim: tuple[float, float] | None = None, ncols: int = 2, formats: Sequence[str] = ("png",),
                   dpi: int = 110) -> list[Path]:
    """A grid of `ForecastPanel`s: fitted points (blue), later points (red), Eq. 1 extended to the end (solid,
    with the band of A's interval, where A is identified; dashed where it is not), the fitted range's end (dotted)."""
    if not panels:
        raise ValueError("plot_forecasts needs at least one panel")
    ncols = min(ncols, len(panels))
    nrows = -(-len(panels) // ncols)
    fig = _new_figure((max(5.5 * ncols, 8.0), 3.9 * nrows), dpi)
    for i, p in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        c, r = np.asarray(p.compute, dtype=np.float64), np.asarray(p.reward, dtype=np.float64)
        n = np.broadcast_to(np.asarray(p.n_samples, dtype=np.float64), c.shape)
        se2 = 2.0 * np.sqrt(np.clip(r * (1 - r), 0, None) / n)
        first = c <= p.fitted_to
        ax.errorbar(c[first], r[first], se2[first], fmt=".", ms=3, lw=0.5, color="tab:blue", label="fitted")
        ax.errorbar(c[~first], r[~first], se2[~first], fmt=".", ms=3, lw=0.5, color="tab:red",
                    label="observed after the fit")
        grid = np.linspace(float(c[c > 0].min()), max(float(c.max()), p.extend_to or 0.0), 400)
        kw = {k: p.params[k] for k in ("B", "C_mid", "R0")}
        if p.identified:
            ax.plot(grid, sigmoid_law(grid, A=p.params["A"], **kw), "k-", lw=1,
                    label=f"Eq. 1 forecast, A {p.params['A']:.3f}")
        else:
            ax.plot(grid, sigmoid_law(grid, A=p.params["A"], **kw), "k--", lw=1,
                    label="fit (A not identified: no forecast)")
        if p.A_interval is not None:
            lo, hi = p.A_interval
            ax.fill_between(grid, sigmoid_law(grid, A=lo, **kw), sigmoid_law(grid, A=hi, **kw), color="k",
                            alpha=0.12 if p.identified else 0.06,
                            label=f"A's 95% interval {lo:.3f}..{hi:.3f}" + ("" if p.identified else " (too wide)"))
        ax.axvline(p.fitted_to, color="grey", ls=":", lw=1)
        ax.set_title(p.title, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        if i % ncols == 0:
            ax.set_ylabel("validation pass rate")
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path, formats, dpi)
