"""Tiny non-negative least squares for the simulator's calibration (`schedule_calibration.calibration_from_records`
fits decode and trainer times as 1- or 2-coefficient linear models of the step's token counts)."""

from __future__ import annotations


def fit_linear(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Non-negative least squares for 1 or 2 coefficients (tiny closed form, no numpy)."""
    if not xs:
        raise ValueError("fit_linear: no samples")
    m = len(xs[0])
    if m == 1:
        sxx = sum(x[0] * x[0] for x in xs)
        return [max(0.0, sum(x[0] * y for x, y in zip(xs, ys)) / sxx) if sxx else 0.0]
    a = sum(x[0] * x[0] for x in xs)
    b = sum(x[0] * x[1] for x in xs)
    c = sum(x[1] * x[1] for x in xs)
    d = sum(x[0] * y for x, y in zip(xs, ys))
    e = sum(x[1] * y for x, y in zip(xs, ys))
    det = a * c - b * b
    if abs(det) <= 1e-12 * max(a * c, 1e-300):
        return [0.0, fit_linear([[x[1]] for x in xs], ys)[0]]
    c0, c1 = (d * c - b * e) / det, (a * e - b * d) / det
    if c0 < 0:
        return [0.0, fit_linear([[x[1]] for x in xs], ys)[0]]
    if c1 < 0:
        return [fit_linear([[x[0]] for x in xs], ys)[0], 0.0]
    return [c0, c1]
