"""Plots: PNG/SVG written with the expected pixel size (read from the PNG header, not from matplotlib)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from scalerl_mega.scaling.fit import fit_sigmoid, sigmoid_law
from scalerl_mega.scaling.plot import CurvePlot, plot_loo, plot_scaling


def png_size(path):
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def _curves():
    out = []
    rng = np.random.default_rng(0)
    for label, (cm, B, A) in {"scalerl": (2542.0, 1.92, 0.61), "scout": (4242.0, 1.65, 0.71)}.items():
        C = np.linspace(0.0, 5 * cm, 61)
        R = sigmoid_law(C, A=A, B=B, C_mid=cm, R0=0.3) + rng.normal(0, 0.0075, C.size)
        f = fit_sigmoid(C, R, r0=0.3, method="fast", fit_to=2.5 * cm)
        out.append(CurvePlot(label=label, compute=C, reward=R, fit=f, heldout_from=2.5 * cm))
    return out


def test_scaling_plot_png_and_svg(tmp_path):
    paths = plot_scaling(_curves(), path=tmp_path / "fig.png", figsize=(8.0, 5.0), dpi=100)
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert png_size(paths[0]) == (800, 500)
    assert b"<svg" in paths[1].read_bytes()[:2000]


def test_loo_plot(tmp_path):
    paths = plot_loo(_curves(), path=tmp_path / "loo", formats=("png",), figsize=(6.0, 4.0), dpi=50)
    assert paths == [tmp_path / "loo.png"]
    assert png_size(paths[0]) == (300, 200)


def test_scaling_plot_with_interval_band_and_cut(tmp_path):
    """With an identify.Assessment the band, the cut line and (when not identified) no extrapolation are drawn;
    the image differs from the plain one (the band and the cut line add pixels)."""
    from dataclasses import replace

    from scalerl_mega.scaling.identify import assess, options_for

    plain = _curves()[:1]
    cv = plain[0]
    a = assess(cv.compute, cv.reward, options=options_for(cv.compute, grid="paper"), n_samples=16000)
    with_band = [replace(cv, assessment=replace(a, identified=True, reason=""))]
    p1 = plot_scaling(plain, path=tmp_path / "plain", formats=("png",))[0]
    p2 = plot_scaling(with_band, path=tmp_path / "band", formats=("png",))[0]
    assert png_size(p2) == (800, 500) and p1.read_bytes() != p2.read_bytes()
    not_ident = [replace(cv, assessment=replace(a, identified=False, reason="test"))]
    p3 = plot_scaling(not_ident, path=tmp_path / "nid", formats=("png",))[0]
    assert p3.read_bytes() != p2.read_bytes()  # no dashed extrapolation, no A line, another legend


def _tick_labels_overlap(fig) -> list[tuple[str, str]]:
    """Pairs of visible x tick labels whose drawn boxes overlap."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in ax.get_xticklabels(which="both")
             if t.get_visible() and t.get_text() and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_log_axis_labels_do_not_overlap_on_short_and_long_ranges():
    """Tick labels overlapped on log axes of less than a decade (matplotlib labels the minor ticks
    there). Any range now gets readable, non-overlapping labels, at least two of them."""
    from scalerl_mega.scaling.plot import scaling_figure

    rng = np.random.default_rng(0)
    for figsize in ((8.0, 5.0), (5.0, 3.5), (4.0, 3.0)):  # (5, 3.5) and (4, 3) overlapped before, on (0.3, 1.9)
        for lo, hi in ((0.0061, 0.0204), (0.3, 1.9), (0.15, 0.9), (1e-3, 12.0), (150.0, 40000.0)):
            C = np.geomspace(lo, hi, 25)
            R = sigmoid_law(C, A=0.7, B=1.5, C_mid=np.sqrt(lo * hi), R0=0.2) + rng.normal(0, 0.003, C.size)
            f = fit_sigmoid(C, R, r0=0.2, method="fast", fit_from=None)
            fig = scaling_figure([CurvePlot(label="run", compute=C, reward=R, fit=f)], xlabel="device-hours",
                                 figsize=figsize, extend_to=2 * hi)
            assert _tick_labels_overlap(fig) == [], (figsize, lo, hi)
            labels = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
            inside = [t for t in fig.axes[0].get_xticks() if lo <= t <= 2 * hi]
            assert len(inside) >= 2 and all(len(x) <= 7 for x in labels), (figsize, lo, hi, labels)


def test_band_is_drawn_and_the_legend_speaks_plainly():
    """The forecast band of `scaling.band` is drawn beyond the fitted data (a filled area, with its legend entry),
    also when A is not identified; the cut's legend entry gives a short number, not `fit cut 0.006981`."""
    from dataclasses import replace

    from matplotlib.collections import PolyCollection

    from scalerl_mega.scaling.band import forecast_band
    from scalerl_mega.scaling.identify import assess, options_for
    from scalerl_mega.scaling.plot import scaling_figure

    C = np.linspace(0.0, 0.0698, 40)
    R = sigmoid_law(C, A=0.7, B=1.6, C_mid=0.01, R0=0.2) + np.random.default_rng(2).normal(0, 0.005, C.size)
    a = assess(C, R, options=options_for(C, grid="relative"), n_samples=1600)
    band = forecast_band(C, R, fit=a.fit, at=np.geomspace(C.max(), 2 * C.max(), 20), n_samples=1600)
    for identified in (True, False):
        cv = CurvePlot(label="run", compute=C, reward=R, fit=a.fit, assessment=replace(a, identified=identified),
                       band=band)
        fig = scaling_figure([cv], xlabel="device-hours", extend_to=2 * C.max())
        ax = fig.axes[0]
        fills = [c for c in ax.collections if isinstance(c, PolyCollection)]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("forecast, 95% band" in t for t in legend) and fills
        verts = np.concatenate([p.vertices for f in fills for p in f.get_paths()])
        assert verts[:, 1].min() == pytest.approx(band.lo.min(), abs=1e-9)  # the band's own edges
        assert verts[:, 1].max() == pytest.approx(band.hi.max(), abs=1e-9)
        cut = next(t for t in legend if "not fitted" in t)
        assert cut == f"run: points before {a.fit_from:.3g} not fitted" and "0.006981" not in " ".join(legend)
