"""The float32 kernels of the SIMD math layer (core/fast_math.h) against float64, through
InferenceSession (so the vectorised loops the ops really run): a log-spaced sweep of both signs
over the whole float range plus the special values. tests/cpp/fast_math_test.cc holds the
functions to their ULP bounds; here each op is held to that bound plus its float32 input's
rounding, and the special values must come out exactly."""
import math

import numpy as np
import pytest

from .single_node import run_node

F32 = np.finfo(np.float32)
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, F32.tiny, -F32.tiny, F32.smallest_subnormal,
                     -F32.smallest_subnormal, F32.max, -F32.max, 88.72, 88.73, -103.9, -104.0, 1e-30, -1e-30],
                    dtype=np.float32)


def sweep():
    mags = np.logspace(-45, 38.5, 20001).astype(np.float32)
    mags = mags[np.isfinite(mags)]
    return np.concatenate([mags, -mags, np.linspace(-12, 12, 4801, dtype=np.float32), SPECIALS])


def sigmoid64(x):
    return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


def softplus64(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def gelu_tanh64(x):
    v = 2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
    return np.where(np.isneginf(x), 0.0, x * sigmoid64(v))


ERF = np.vectorize(math.erf, otypes=[np.float64])

# op, attrs, domain, float64 reference, the ulp bound fast_math.h states
CASES = [
    ("Exp", {}, "", np.exp, 1),
    ("Log", {}, "", np.log, 1),
    ("Tanh", {}, "", np.tanh, 1.5),
    ("Erf", {}, "", ERF, 2.5),
    ("Sigmoid", {}, "", sigmoid64, 3),
    ("Softplus", {}, "", softplus64, 3),
    ("Gelu", {"approximate": "tanh"}, "onnxtrain", gelu_tanh64, 4),
]


def ulp_errors(got, want):
    with np.errstate(over="ignore"):
        want32 = want.astype(np.float32)  # inf where the float result overflows
    w = np.where(np.isinf(want32), np.sign(want) * 2.0 ** 128, want)
    g = np.where(np.isinf(got), np.sign(got) * 2.0 ** 128, got.astype(np.float64))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(w)))
    ulp = np.exp2(np.maximum(np.where(np.isfinite(e), e, -149) - 23, -149))
    err = np.abs(g - w) / ulp
    return np.where(g == w, 0.0, err)


@pytest.mark.parametrize("op,attrs,domain,ref,bound", CASES, ids=[c[0] for c in CASES])
def test_float32_kernel_within_its_ulp_bound_over_the_float_range(op, attrs, domain, ref, bound):
    x = sweep()
    (y,) = run_node(op, [x], attrs, domain=domain)
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(y), nan), x[np.isnan(y) != nan]
    if op == "Gelu":  # the denormal tail: half an ulp of 2^-149 times |x| (fast_math.h)
        keep = x >= -9
    else:
        keep = np.ones_like(x, dtype=bool)
    err = ulp_errors(y[~nan & keep], want[~nan & keep])
    worst = int(np.argmax(err))
    assert err[worst] <= bound, (op, x[~nan & keep][worst], y[~nan & keep][worst], want[~nan & keep][worst], err[worst])
    # Odd functions keep the sign of zero.
    if op in ("Tanh", "Erf"):
        (z,) = run_node(op, [np.array([-0.0, 0.0], np.float32)], attrs, domain=domain)
        assert np.signbit(z).tolist() == [True, False]


def test_float32_gelu_grad_tanh_form_matches_float64():
    from .single_node import run_node as run
    x = sweep()
    x = x[np.isfinite(x) & (np.abs(x) < 1e6)]
    dy = np.ones_like(x)
    (dx,) = run("GeluGrad", [dy, x], {"approximate": "tanh"}, domain="onnxtrain")
    x64 = x.astype(np.float64)
    t = np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3))
    want = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x64 ** 2)
    np.testing.assert_allclose(dx, want, rtol=4e-7, atol=2 ** -23)
