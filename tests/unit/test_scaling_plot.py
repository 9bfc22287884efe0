"""Plots: PNG/SVG written with the expected pixel size (read from the PNG header, not from matplotlib)."""

from __future__ import annotations

import struct

import numpy as np

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
