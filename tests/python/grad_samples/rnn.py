"""Samples for the recurrent ops in src/ops/rnn/ (RNN, GRU, LSTM; their gradients are the fused
onnxtrain.RNNGrad / GRUGrad / LSTMGrad ops). Small sizes: seq 3, batch 2, input 3, hidden 2."""
import numpy as np

from ..gradcheck import Sample

rng = np.random.default_rng(23)

SEQ, BATCH, INPUT, HIDDEN = 3, 2, 3, 2


def _r(*shape, scale=0.6):
    return rng.standard_normal(shape) * scale


def _inputs(gates, dirs=1, layout=0, bias=True, lens=None, init_h=False, init_c=False, peephole=False):
    """X, W, R, B?, sequence_lens?, initial_h?[, initial_c?, P?] as float64 (lens int32)."""
    x = _r(SEQ, BATCH, INPUT) if layout == 0 else _r(BATCH, SEQ, INPUT)
    state = (dirs, BATCH, HIDDEN) if layout == 0 else (BATCH, dirs, HIDDEN)
    ins = [x, _r(dirs, gates * HIDDEN, INPUT), _r(dirs, gates * HIDDEN, HIDDEN),
           _r(dirs, 2 * gates * HIDDEN, scale=0.3) if bias else None,
           np.array(lens, np.int32) if lens is not None else None,
           _r(*state) if init_h else None]
    if gates == 4:
        ins += [_r(*state) if init_c else None, _r(dirs, 3 * HIDDEN, scale=0.4) if peephole else None]
    while ins[-1] is None:
        ins.pop()
    return ins


def _variants(op, gates, n_states, extra=None):
    extra = extra or {}
    outs_all = tuple(range(1 + n_states))
    lens_const = 4  # sequence_lens' input index
    samples = [
        Sample(_inputs(gates), attrs={"hidden_size": HIDDEN, **extra}, outputs=(0,), n_outputs=1, name="forward"),
        Sample(_inputs(gates, init_h=True, init_c=gates == 4), attrs={"hidden_size": HIDDEN, **extra},
               outputs=outs_all, n_outputs=1 + n_states, name="all outputs, initial states"),
        Sample(_inputs(gates, dirs=2, init_h=True, init_c=gates == 4),
               attrs={"hidden_size": HIDDEN, "direction": "bidirectional", **extra},
               outputs=outs_all, n_outputs=1 + n_states, name="bidirectional"),
        Sample(_inputs(gates, init_h=True), attrs={"hidden_size": HIDDEN, "direction": "reverse", **extra},
               outputs=(0, 1), n_outputs=1 + n_states, name="reverse"),
        Sample(_inputs(gates, bias=False), attrs={"hidden_size": HIDDEN, **extra}, outputs=(1,),
               n_outputs=2, name="no bias, Y_h only"),
        Sample(_inputs(gates, dirs=2, layout=1, init_h=True, init_c=gates == 4),
               attrs={"hidden_size": HIDDEN, "direction": "bidirectional", "layout": 1, **extra},
               outputs=outs_all, n_outputs=1 + n_states, opset=14, name="layout 1 bidirectional"),
        Sample(_inputs(gates, lens=[3, 1], init_h=True), attrs={"hidden_size": HIDDEN, **extra},
               outputs=(0, 1), n_outputs=1 + n_states, constants=[lens_const], name="sequence_lens"),
        Sample(_inputs(gates, dirs=2, lens=[2, 0], init_h=True, init_c=gates == 4),
               attrs={"hidden_size": HIDDEN, "direction": "bidirectional", **extra},
               outputs=outs_all, n_outputs=1 + n_states, constants=[lens_const],
               name="sequence_lens bidirectional with an empty row"),
        Sample(_inputs(gates, dirs=1, layout=1, lens=[1, 3]),
               attrs={"hidden_size": HIDDEN, "direction": "reverse", "layout": 1, **extra},
               outputs=outs_all, n_outputs=1 + n_states, constants=[lens_const], opset=14,
               name="sequence_lens reverse layout 1"),
    ]
    return samples


def _rnn():
    s = _variants("RNN", 1, 1)
    s.append(Sample(_inputs(1, init_h=True), attrs={"hidden_size": HIDDEN, "activations": ["Softsign"]},
                    outputs=(0, 1), n_outputs=2, name="Softsign"))
    s.append(Sample(_inputs(1, dirs=2), attrs={"hidden_size": HIDDEN, "direction": "bidirectional",
                                               "activations": ["ScaledTanh", "Elu"],
                                               "activation_alpha": [1.3, 0.8], "activation_beta": [0.7]},
                    outputs=(0, 1), n_outputs=2, name="ScaledTanh / Elu"))
    return s


def _gru():
    s = _variants("GRU", 3, 1, {"linear_before_reset": 0}) + _variants("GRU", 3, 1, {"linear_before_reset": 1})
    s.append(Sample(_inputs(3, init_h=True), attrs={"hidden_size": HIDDEN, "linear_before_reset": 1,
                                                    "activations": ["HardSigmoid", "Softsign"]},
                    outputs=(0, 1), n_outputs=2, name="HardSigmoid / Softsign"))
    return s


def _lstm():
    s = _variants("LSTM", 4, 2)
    s.append(Sample(_inputs(4, dirs=2, init_h=True, init_c=True, peephole=True),
                    attrs={"hidden_size": HIDDEN, "direction": "bidirectional"},
                    outputs=(0, 1, 2), n_outputs=3, name="peepholes"))
    s.append(Sample(_inputs(4, lens=[2, 3], init_h=True, init_c=True, peephole=True),
                    attrs={"hidden_size": HIDDEN, "input_forget": 1}, constants=[4],
                    outputs=(0, 1, 2), n_outputs=3, name="input_forget, peepholes, sequence_lens"))
    s.append(Sample(_inputs(4, init_h=True, init_c=True), attrs={"hidden_size": HIDDEN, "clip": 0.9},
                    outputs=(0, 1, 2), n_outputs=3, name="clip"))
    s.append(Sample(_inputs(4, init_h=True, init_c=True),
                    attrs={"hidden_size": HIDDEN, "activations": ["HardSigmoid", "Softsign", "Tanh"]},
                    outputs=(0, 2), n_outputs=3, name="HardSigmoid / Softsign / Tanh"))
    return s


SAMPLES = {"RNN": _rnn(), "GRU": _gru(), "LSTM": _lstm()}
