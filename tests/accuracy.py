"""The accuracy contract, as assertions (shared by the LayerNorm and RMSNorm tests).

- float32 outputs: within 1e-5 of the float64 reference, relative to the
  array's scale (its largest |value|).
- float64 outputs: within 1e-12, relative to the scale.
  (Where that is below half the dtype's smallest subnormal, the scale being
  subnormal itself, that half-spacing is the bound: no stored value is closer.)
- bfloat16 / float16 outputs: within one ulp of the correctly rounded float64
  result, and at least 98% exactly correctly rounded -- a statistical
  property, judged on arrays of at least 500 elements (a near-tie can put a
  handful of symmetric elements one ulp off in a tiny array). Elements so small that their ulp is
  below 2**-20 of the array's scale (|value| < 2**-13 of the scale for bf16,
  2**-10 for f16) are judged with the ulp at that level: such values come from
  cancellation, where any fp32 pipeline carries an absolute error of a few
  fp32 ulps of the scale, more than a half-precision ulp of a tiny number.
- bfloat16 results below 2**-126 (fp32's smallest normal) may be flushed to
  zero: cynorm's bf16 rounding treats fp32 subnormals as zero on every path,
  because the hardware instruction (VCVTNEPS2BF16) does.
- dx is a difference of terms of size rstd*|dy*w|; its scale is the larger of
  max|dx| and that term size (RMSNorm with N = 1, say, cancels almost exactly).
"""

import numpy as np

import reference as ref
from conftest import BF16, F16, F32, F64

#: below this fraction of the scale, judge with the ulp at this level (see above)
TINY = {"bfloat16": 2.0 ** -13, "float16": 2.0 ** -10}


def check(got, want, dtype, what="", scale=None):
    """Assert that `got` (stored in dtype) meets the contract against float64 `want`.

    scale: the array's scale (default: its largest |value|)."""
    dtype = np.dtype(dtype)
    got = np.asarray(got)
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    g = got.astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    assert np.array_equal(nan_g, nan_w), f"{what}: NaN pattern differs ({nan_g.sum()} vs {nan_w.sum()})"
    g, w = g[~nan_w], w[~nan_w]
    if g.size == 0:
        return
    if scale is None:
        scale = float(np.max(np.abs(w[np.isfinite(w)]), initial=0.0)) or 1.0
    if dtype in (F32, F64):
        tol = 1e-5 if dtype == F32 else 1e-12
        err = float(np.max(np.abs(g - w)))
        # a subnormal scale: the dtype's own spacing there is the floor (no
        # stored value is closer than half of it to the exact result)
        allowed = max(tol * scale, 0.5 * float(np.finfo(dtype).smallest_subnormal))
        assert err <= allowed, f"{what}: max error {err:.3g} > {tol:g} x scale {scale:.3g}"
        return
    fmt = "bfloat16" if dtype == BF16 else "float16"
    rounded = ref.round_to(w, fmt)
    if dtype == BF16:  # the documented flush of fp32-subnormal results
        flushed = (np.abs(w) < 2.0 ** -126) & (g == 0)
        rounded = np.where(flushed, 0.0, rounded)
    floor = scale * TINY[fmt]
    u = ref.ulp(np.maximum(np.abs(rounded), floor), fmt)
    off = np.abs(g - rounded)
    worst = float(np.max(off / u))
    assert worst <= 1.0, f"{what}: {worst:.2f} ulp from the correctly rounded result"
    judged = np.abs(rounded) >= floor          # below the floor only the ulp bound applies
    wrong = int(np.count_nonzero((g != rounded) & judged))
    count = int(np.count_nonzero(judged))
    if count >= 500:
        assert wrong <= 0.02 * count, f"{what}: {wrong} of {count} not correctly rounded (more than 2%)"


def check_stat(got, want, what=""):
    """mean/rstd (float32 or float64): relative to their own scale."""
    dtype = np.asarray(got).dtype
    tol = 1e-12 if dtype == F64 else 1e-5
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64).reshape(g.shape)
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what}: NaN pattern differs"
    ok = ~np.isnan(w)
    scale = float(np.max(np.abs(w[ok]), initial=0.0)) or 1.0
    err = float(np.max(np.abs(g[ok] - w[ok]), initial=0.0))
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} x {scale:.3g}"


def check_param_grad(got, want, dtype, what=""):
    """dweight/dbias: fp32 within 1e-5 (x scale), f64 1e-12; 16-bit within one ulp of the exact value."""
    dtype = np.dtype(dtype)
    g = np.asarray(got)
    assert g.dtype == dtype, f"{what}: dtype {g.dtype}, expected {dtype}"
    g = g.astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(w), initial=0.0)) or 1.0
    if dtype in (F32, F64):
        tol = 1e-5 if dtype == F32 else 1e-12
        err = float(np.max(np.abs(g - w), initial=0.0))
        assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} x scale {scale:.3g}"
    else:
        fmt = "bfloat16" if dtype == BF16 else "float16"
        u = ref.ulp(np.maximum(np.abs(w), scale * TINY[fmt]), fmt)
        worst = float(np.max(np.abs(g - w) / u, initial=0.0))
        assert worst <= 1.0, f"{what}: {worst:.2f} ulp from the exact value"


def dx_scale(dx_ref, dy, rstd, weight=None):
    """Scale for judging dx: max(|dx|, rstd*|dy*w|)."""
    g = np.abs(np.asarray(dy, dtype=np.float64))
    if weight is not None:
        g = g * np.abs(np.asarray(weight, dtype=np.float64))
    r = np.asarray(rstd, dtype=np.float64)
    r = r.reshape(r.shape + (1,) * (g.ndim - r.ndim)) if r.ndim < g.ndim else r
    terms = float(np.nanmax(np.where(np.isfinite(r * g), r * g, 0), initial=0.0))
    finite = np.asarray(dx_ref)[np.isfinite(dx_ref)]
    return max(float(np.max(np.abs(finite), initial=0.0)), terms) or 1.0
