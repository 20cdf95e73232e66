#!/usr/bin/env python3
"""Fits the rational tanh of the CUDA tensor-core kernels' softcap (kernels/cuda/softcap.cuh,
RationalTanh) and prints its coefficients and its error in float32 arithmetic.

tanh(x) ~ x * N(x^2) / D(x^2) on [-C, C] (x clamped there outside), N and D polynomials of
degree 4 in x^2 with N(0) = D(0) = 1. The fit is linearised least squares on N - f D = f - 1
(f = tanh(x) / x), weighted by x / D from the previous pass so that it measures the absolute
error of x N / D, with Lawson's reweighting (each point's weight times its error) driving it
toward the least largest error. Needs numpy.
"""
import numpy as np
from numpy.polynomial import polynomial as P

DEGREE, CLAMP, PASSES = 4, 9.0, 80


def fit():
    x = np.sort(np.concatenate([np.linspace(0, CLAMP, 30000)[1:], np.geomspace(1e-6, 0.5, 3000)]))
    u, f = x * x, np.tanh(x) / x
    powers = np.vstack([u**k for k in range(1, DEGREE + 1)]).T
    weight, den_prev, best = np.ones_like(u), np.ones_like(u), None
    for _ in range(PASSES):
        a_mat = np.hstack([powers, -f[:, None] * powers])
        w = np.sqrt(weight) * x / den_prev
        sol, *_ = np.linalg.lstsq(a_mat * w[:, None], (f - 1) * w, rcond=None)
        num = np.concatenate([[1.0], sol[:DEGREE]])
        den = np.concatenate([[1.0], sol[DEGREE:]])
        den_prev = P.polyval(u, den)
        err = np.abs(np.tanh(x) - x * P.polyval(u, num) / den_prev)
        if best is None or err.max() < best[0]:
            best = (err.max(), num.copy(), den.copy())
        weight = weight * (err / err.max() + 1e-3)
        weight /= weight.sum()
    return best[1].astype(np.float32), best[2].astype(np.float32)


def in_float32(x, num, den):
    """The kernels' arithmetic: clamp, Horner in float32, one division."""
    c = np.where(np.abs(x) > CLAMP, np.copysign(np.float32(CLAMP), x), x).astype(np.float32)
    u = c * c

    def horner(coef):
        acc = np.full_like(u, coef[-1])
        for k in range(len(coef) - 2, -1, -1):
            acc = acc * u + coef[k]
        return acc

    return (c * horner(num)) / horner(den)


def main():
    num, den = fit()
    x = np.linspace(-12, 12, 2400001, dtype=np.float32)
    t, ref = in_float32(x, num, den), np.tanh(x.astype(np.float64))
    err = np.abs(t - ref)
    nonzero = x != 0
    print("N (powers 0-4 of x^2):", ", ".join("%.9ef" % v for v in num))
    print("D (powers 0-4 of x^2):", ", ".join("%.9ef" % v for v in den))
    relative = (err[nonzero] / np.abs(ref[nonzero])).max()
    print("largest error in float32: absolute %.2e, relative %.2e" % (err.max(), relative))


if __name__ == "__main__":
    main()
