"""Samples for the elementwise ops in src/ops/elementwise/.

Inputs stay away from kinks, ties and domain edges, where central differences are meaningless.
"""
import numpy as np

from ..gradcheck import Sample

rng = np.random.default_rng(7)


def _n(*shape):
    return rng.standard_normal(shape)


def _away(*shape, margin=0.2):
    """Normal values pushed at least `margin` away from 0 (for Relu, Abs, LeakyRelu, ...)."""
    v = rng.standard_normal(shape)
    return np.where(v >= 0, v + margin, v - margin)


def _pos(*shape):
    return np.abs(rng.standard_normal(shape)) + 0.5


def _unit(*shape):
    return 0.8 * np.tanh(rng.standard_normal(shape))


def _binary(positive_b=False):
    b = _pos if positive_b else _n
    return [Sample([_n(3, 4), b(3, 4)], name="same shape"),
            Sample([_n(3, 4), b(4)], name="(3,4) with (4,)"),
            Sample([_n(2, 1, 3), b(1, 4, 1)], name="(2,1,3) with (1,4,1)"),
            Sample([np.array(0.7), b(2, 3)], name="scalar with matrix"),
            Sample([_n(2, 3), b(1)], name="matrix with (1,)")]


def _unary(make, shapes=((3, 4), (2, 1, 3), ())):
    return [Sample([make(*s)], name=f"shape {s}") for s in shapes]


def _no_ties(*shapes):
    vals = rng.permutation(np.arange(sum(int(np.prod(s)) for s in shapes), dtype=np.float64)) * 0.37 - 3.0
    out, k = [], 0
    for s in shapes:
        n = int(np.prod(s))
        out.append(vals[k:k + n].reshape(s))
        k += n
    return out


SAMPLES = {
    "Add": _binary(),
    "Sub": _binary(),
    "Mul": _binary(),
    "Div": _binary(positive_b=True),
    "Pow": [Sample([_pos(3, 4), _n(3, 4)], name="same shape"),
            Sample([_pos(2, 1, 3), _n(1, 4, 1)], name="(2,1,3) with (1,4,1)"),
            Sample([_pos(3, 4), np.array(2.5)], name="scalar exponent"),
            Sample([_n(3, 4), np.array(3, dtype=np.int64)], name="integer exponent, negative base"),
            Sample([_n(2, 3), np.array([2.0, 3.0, 1.0])], wrt=[0], name="constant integral exponents")],
    "Mod": [Sample([_pos(3, 4) * 3, np.full((3, 4), 0.7)], attrs={"fmod": 1}, name="fmod same shape"),
            Sample([np.array([[2.3, -2.3, 5.1], [-4.4, 1.2, 0.3]]), np.array([0.9, 1.7, -2.2])],
                   attrs={"fmod": 1}, name="fmod broadcast, mixed signs")],
    "Relu": _unary(_away),
    "Neg": _unary(_n),
    "Abs": _unary(_away),
    "Exp": _unary(_n),
    "Log": _unary(_pos),
    "Sqrt": _unary(_pos),
    "Tanh": _unary(_n),
    "Sigmoid": _unary(_n),
    "Erf": _unary(_n),
    "Reciprocal": _unary(lambda *s: _away(*s, margin=0.5)),
    "Softplus": _unary(lambda *s: 3 * _n(*s)),
    "Softsign": _unary(_away),
    "Sin": _unary(_n),
    "Cos": _unary(_n),
    "Tan": _unary(_unit),
    "Asin": _unary(_unit),
    "Acos": _unary(_unit),
    "Atan": _unary(_n),
    "Sinh": _unary(_n),
    "Cosh": _unary(_n),
    "Asinh": _unary(_n),
    "Acosh": _unary(lambda *s: 1.5 + np.abs(_n(*s))),
    "Atanh": _unary(_unit),
    "Where": [Sample([rng.random((3, 4)) > 0.5, _n(3, 4), _n(3, 4)], name="same shape"),
              Sample([rng.random((2, 1, 3)) > 0.5, _n(4, 1), _n(3)], name="three-way broadcast"),
              Sample([np.array(True), np.array(1.5), _n(2, 3)], name="scalars")],
    "Max": [Sample(_no_ties((3, 4)), name="one input"),
            Sample(_no_ties((3, 4), (4,)), name="broadcast pair"),
            Sample(_no_ties((2, 1, 3), (1, 4, 1), ()), name="three inputs with a scalar")],
    "Min": [Sample(_no_ties((3, 4), (3, 4)), name="same shape"),
            Sample(_no_ties((2, 1, 3), (1, 4, 1), ()), name="three inputs with a scalar")],
    "Sum": [Sample([_n(3, 4)], name="one input"),
            Sample([_n(3, 4), _n(4), np.array(0.3)], name="broadcast with scalar")],
    "Mean": [Sample([_n(3, 4), _n(3, 4)], name="same shape"),
             Sample([_n(2, 1, 3), _n(1, 4, 1), _n(3)], name="three inputs broadcast")],
    "Clip": [Sample([np.array([[-2.0, -0.3, 0.4], [1.7, 0.1, -1.4]]), np.array(-1.0), np.array(1.0)],
                    constants=[1, 2], name="constant bounds"),
             Sample([np.array([[-2.0, -0.3, 0.4], [1.7, 0.1, -1.4]]), np.array(-1.0), np.array(1.0)],
                    name="bounds differentiated"),
             Sample([np.array([-2.0, -0.3, 0.4, 1.7]), np.array(-1.0)], name="min only"),
             Sample([np.array([-2.0, -0.3, 0.4, 1.7]), None, np.array(1.0)], name="max only"),
             Sample([np.array([-2.0, -0.3, 0.4, 1.7])], attrs={"min": -1.0, "max": 1.0}, opset=10,
                    name="attribute bounds (opset 10)")],
    "Cast": [Sample([_n(3, 4)], attrs={"to": 11}, name="double to double"),
             Sample([_n(2, 3)], attrs={"to": 1}, eps=1e-2, rtol=1e-4, atol=1e-5, name="double to float (float32 rounding: a larger step)")],
    "CastLike": [Sample([_n(3, 4), np.array(1.0)], constants=[1], name="like double")],
    "Elu": [Sample([_away(3, 4)], name="default alpha"), Sample([_away(2, 3)], attrs={"alpha": 0.5}, name="alpha 0.5")],
    "LeakyRelu": [Sample([_away(3, 4)], name="default alpha"),
                  Sample([_away(2, 3)], attrs={"alpha": 0.3}, name="alpha 0.3")],
    "Selu": [Sample([_away(3, 4)], name="defaults"),
             Sample([_away(2, 3)], attrs={"alpha": 1.2, "gamma": 0.9}, name="alpha, gamma")],
    "Celu": [Sample([_away(3, 4)], name="default alpha"), Sample([_away(2, 3)], attrs={"alpha": 2.0}, name="alpha 2")],
    "HardSigmoid": [Sample([np.array([-4.0, -2.0, -0.7, 0.3, 1.9, 4.0])], name="defaults (both clamps)"),
                    Sample([np.array([[-1.5, 0.2], [0.6, 3.0]])], attrs={"alpha": 0.5, "beta": 0.4},
                           name="alpha, beta")],
    "HardSwish": [Sample([np.array([-4.5, -2.0, -0.7, 0.3, 1.9, 4.2])], opset=14, name="all three pieces")],
    "ThresholdedRelu": [Sample([np.array([-1.0, 0.5, 1.4, 2.2])], opset=10, name="default alpha"),
                        Sample([np.array([[-1.0, 0.1], [0.5, 2.2]])], attrs={"alpha": 0.3}, opset=10,
                               name="alpha 0.3")],
    "Shrink": [Sample([np.array([-1.3, -0.2, 0.1, 0.9])], opset=9, name="defaults"),
               Sample([np.array([[-2.0, -0.5], [0.4, 1.6]])], attrs={"lambd": 1.0, "bias": 0.3}, opset=9,
                      name="lambd, bias")],
    "PRelu": [Sample([_away(3, 4), _n(3, 4)], name="same shape"),
              Sample([_away(2, 3, 4), _n(3, 1)], name="slope (3,1) broadcast"),
              Sample([_away(2, 3), np.array([0.25])], name="one slope")],
}
