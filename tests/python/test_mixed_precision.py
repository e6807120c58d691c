"""Mixed precision (issue 10): cpu_features, bf16 GEMMs, the mixed-precision graph pass through
generate_artifacts, and its bad-input errors. Quick: a tiny BERT-style classifier trained a few
steps; the 200-step curves are bench/bench_mixed_precision.py's job."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import onnxtrain
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer

from .build_paths import ONNXTRAIN

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402  (the shared reference models)

GEMMS = {"MatMul", "Gemm", "FusedMatMul"}


def test_cpu_features_reports_flags_and_engine_choice():
    f = onnxtrain.cpu_features()
    for key in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"):
        assert isinstance(f[key], bool), key
    assert isinstance(f["onednn_isa"], str) and f["onednn_isa"]
    # A native bf16 GEMM needs AVX512-BF16 or AMX (oneDNN 2.x has no other bf16 kernels).
    assert not f["bf16_matmul_native"] or f["avx512_bf16"] or f["amx_bf16"]
    assert not f["fp16_matmul_native"] or f["avx512_fp16"] or f["amx_fp16"]
    with open("/proc/cpuinfo") as cpuinfo:
        flags = next((line for line in cpuinfo if line.startswith("flags")), "").split()
    if flags:  # the kernel's view of the same bits
        assert f["avx512f"] == ("avx512f" in flags)
        assert f["avx512_bf16"] == ("avx512_bf16" in flags)
        assert f["f16c"] == ("f16c" in flags)


def test_cpu_features_reports_measured_gemm_rates_and_the_cpu_model():
    f = onnxtrain.cpu_features()
    rates = f["gemm_gflops"]
    assert rates["source"] in ("measured", "ONNXTRAIN_GEMM_RATES")
    if rates["source"] == "measured":
        assert rates["fp32"] > 1.0  # a 256 x 512 x 512 product: any CPU this runs on does a GFLOP/s
        assert (rates["bf16"] > 0.0) == f["bf16_matmul_native"]
    assert f["bf16_pays"] == (rates["bf16"] > rates["fp32"])
    with open("/proc/cpuinfo") as cpuinfo:
        name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    if name and f["vendor"]:
        assert " ".join(f["model"].split()) == " ".join(name.split())  # CPUID's brand string, as the kernel shows it


BF16_MLP = """
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import onnxtrain
from onnxtrain import artifacts
rng = np.random.default_rng(0)
inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in [("w", (8, 4)), ("b", (4,))]]
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])], "mlp",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
for i in range(2):  # the note is said once per process
    artifacts.generate_artifacts(m, requires_grad=["w", "b"], loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.AdamW(), artifact_directory=sys.argv[1] + str(i),
                                 mixed_precision="bf16")
print(onnxtrain.cpu_features()["gemm_gflops"])
"""


@pytest.mark.parametrize("rates,said", [("fp32=235,bf16=143", True), ("fp32=250,bf16=0", True),
                                        ("fp32=200,bf16=900", False)])
def test_bf16_where_it_does_not_pay_says_so_once_naming_the_cpu_and_both_rates(tmp_path, rates, said):
    env = {**os.environ, "ONNXTRAIN_GEMM_RATES": rates}
    proc = subprocess.run([sys.executable, "-c", BF16_MLP, str(tmp_path / "art")], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "bf16 mixed precision on" in line]
    fp32, bf16 = (r.split("=")[1] for r in rates.split(","))
    if said:
        assert len(notes) == 1, proc.stderr
        assert onnxtrain.cpu_features()["model"] in notes[0]
        assert f"{fp32}" in notes[0] and f"{bf16} GFLOP/s" in notes[0] and "ONNXTRAIN_GEMM_RATES" in notes[0]
        assert "half the activation memory" in notes[0]  # what the user still gets
    else:
        assert not notes, proc.stderr
    assert f"'fp32': {float(fp32)}" in proc.stdout and "'source': 'ONNXTRAIN_GEMM_RATES'" in proc.stdout


def test_malformed_gemm_rates_are_an_error_naming_the_variable(tmp_path):
    code = "import onnxtrain; onnxtrain.cpu_features()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ONNXTRAIN_GEMM_RATES": "fp32=fast"})
    assert proc.returncode != 0
    assert "ONNXTRAIN_GEMM_RATES: expected fp32=GFLOPS,bf16=GFLOPS" in proc.stderr and "fp32=fast" in proc.stderr


def _bf16_round(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.view(np.float32)


@pytest.mark.parametrize("low", [TensorProto.BFLOAT16, TensorProto.FLOAT16])
@pytest.mark.parametrize("trans_b,bias", [(0, False), (1, True)])
def test_half_gemm_matches_float64_on_rounded_inputs(low, trans_b, bias):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 37, 64)).astype(np.float32)
    b = rng.standard_normal((48, 64) if trans_b else (64, 48)).astype(np.float32)
    c = rng.standard_normal(48).astype(np.float32)
    rnd = _bf16_round if low == TensorProto.BFLOAT16 else (lambda v: v.astype(np.float16).astype(np.float32))
    a, b, c = rnd(a), rnd(b), rnd(c)
    names = ["a", "b"] + (["c"] if bias else [])
    casts = [helper.make_node("Cast", [n], [n + "_lp"], to=low) for n in names]
    mm = helper.make_node("FusedMatMul", [n + "_lp" for n in names], ["y_lp"], domain="onnxtrain", transB=trans_b,
                          alpha=0.5)
    back = helper.make_node("Cast", ["y_lp"], ["y"], to=TensorProto.FLOAT)
    feeds = {"a": a, "b": b, "c": c}
    graph = helper.make_graph(casts + [mm, back], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, feeds[n].shape) for n in names],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxtrain", 1)])
    y = onnxtrain.InferenceSession(model.SerializeToString()).run(None, {n: feeds[n] for n in names})[0]
    bt = b.astype(np.float64).T if trans_b else b.astype(np.float64)
    ref = 0.5 * a.astype(np.float64) @ bt + (c if bias else 0)
    # One rounding of the fp32-accumulated result: half an ulp of the output type.
    rel = 2.0 ** -8 if low == TensorProto.BFLOAT16 else 2.0 ** -11
    np.testing.assert_allclose(y, ref, rtol=rel, atol=rel * np.abs(ref).max() * 0.05)


# --------------------------------------------------------------------------------------------------
# The pass, through generate_artifacts

def _tiny_bert(seed=0):
    torch.manual_seed(seed)
    cfg = models.BertConfig(vocab_size=64, hidden=32, layers=2, heads=2, ffn=64, max_len=16)
    model = models.BertClassifier(cfg, num_classes=3)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 64, (4, 16), generator=g)
    y = torch.randint(0, 3, (4,), generator=g)
    return model, x, y


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory):
    model, x, y = _tiny_bert()
    path = str(tmp_path_factory.mktemp("bert") / "bert.onnx")
    models.export(model, (x,), path, ["x"], ["logits"], training=True)
    params = [n for n, _ in model.named_parameters()]
    return path, params, x.numpy(), y.numpy()


def _artifacts(bert_onnx, directory, mode):
    path, params, _, _ = bert_onnx
    return artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.CrossEntropyLoss,
                                        optimizer=artifacts.AdamW(lr=3e-3), artifact_directory=str(directory),
                                        mixed_precision=mode)


def _dtypes(graph):
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    types.update({t.name: t.data_type for t in graph.initializer})
    return types


def _check_gemm_dtypes(g, types, low):
    """Every GEMM (forward and backward) reads `low` and writes `low`, or fp32 where a Cast to fp32
    was its only reader (folded: output_dtype = float; no such Cast is left after a MatMul or
    FusedMatMul; ONNX Gemm has no output dtype and keeps its Cast)."""
    gemms = [n for n in g.node if n.op_type in GEMMS]
    assert gemms
    producers = {o: n for n in g.node for o in n.output}
    folded = 0
    for n in gemms:
        wide = any(a.name == "output_dtype" and a.i == TensorProto.FLOAT for a in n.attribute)
        folded += wide
        for v in n.input:
            if v:
                assert types.get(v) == low, (n.name, v, types.get(v))
        assert types.get(n.output[0]) == (TensorProto.FLOAT if wide else low), (n.name, n.output[0])
    assert folded, "weight gradients are written in fp32 by their GEMM"
    for n in g.node:
        if n.op_type == "Cast" and n.input[0] in producers:
            p = producers[n.input[0]]
            assert not (p.op_type in ("MatMul", "FusedMatMul") and sum(n.input[0] in c.input for c in g.node) == 1), (
                f"Cast {n.name} after {p.name} is the product's only reader: it should have been folded")


def test_bf16_training_graph_shape(bert_onnx, tmp_path):
    paths = _artifacts(bert_onnx, tmp_path, "bf16")
    m = onnx.load(paths[0])
    g = m.graph
    types = _dtypes(g)
    params = set(bert_onnx[1])
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["onnxtrain.mixed_precision"] == "bf16"
    _check_gemm_dtypes(g, types, TensorProto.BFLOAT16)
    # One Cast per parameter, however many nodes read it.
    casts_of = {}
    for n in g.node:
        if n.op_type == "Cast" and n.input[0] in params:
            casts_of[n.input[0]] = casts_of.get(n.input[0], 0) + 1
    assert casts_of and max(casts_of.values()) == 1, casts_of
    # Parameters, gradients and the loss stay fp32; so do LayerNorm and the loss.
    for p in params:
        assert types[p] == TensorProto.FLOAT
        assert types[p + "_grad"] == TensorProto.FLOAT
    assert types["loss"] == TensorProto.FLOAT
    for n in g.node:
        if n.op_type in ("LayerNormalization", "SoftmaxCrossEntropyLoss"):
            assert types[n.input[0]] == TensorProto.FLOAT, n.name
        if n.op_type in ("Softmax", "SoftmaxGrad"):  # attention: between two bf16 GEMMs
            assert types[n.input[0]] == TensorProto.BFLOAT16, n.name
    # No cast reads the output of a cast back into the dtype it came from.
    producer = {o: n for n in g.node for o in n.output}
    for n in g.node:
        if n.op_type == "Cast" and n.input[0] in producer and producer[n.input[0]].op_type == "Cast":
            src = producer[n.input[0]].input[0]
            assert types.get(src) != helper.get_attribute_value(next(a for a in n.attribute if a.name == "to")), n.name
    # The eval graph (and what is exported from it) stays fp32 and in standard ops.
    ev = onnx.load(paths[1])
    assert TensorProto.BFLOAT16 not in _dtypes(ev.graph).values()
    assert "onnxtrain.mixed_precision" not in {p.key for p in ev.metadata_props}
    # The optimizer and the checkpoint hold fp32 masters.
    opt = onnx.load(paths[2])
    assert all(i.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.INT64) for i in opt.graph.input)
    state = CheckpointState.load_checkpoint(paths[3])
    for p in params:
        assert state.parameters[p].data.dtype == np.float32


def _train(paths, x, y, steps):
    state = CheckpointState.load_checkpoint(paths[3])
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    losses = []
    for _ in range(steps):
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    return np.array(losses), module(x, y)


def test_bf16_curve_follows_fp32(bert_onnx, tmp_path):
    _, _, x, y = bert_onnx
    fp32 = _artifacts(bert_onnx, tmp_path / "fp32", None)
    bf16 = _artifacts(bert_onnx, tmp_path / "bf16", "bf16")
    # The same initial weights: the checkpoints differ only in their recorded mode and seed.
    l32, _ = _train(fp32, x, y, 25)
    l16, eval16 = _train(bf16, x, y, 25)
    assert np.isfinite(l16).all()
    assert abs(l16[0] - l32[0]) < 0.02 * abs(l32[0])          # one bf16 forward
    assert l16[-1] < 0.5 * l16[0] and l32[-1] < 0.5 * l32[0]  # both learn the batch
    np.testing.assert_allclose(l16[::5], l32[::5], rtol=0.1, atol=0.05)
    assert np.asarray(eval16).dtype == np.float32             # eval outputs keep their dtype


def test_bad_mixed_precision_value_changes_nothing_on_disk(bert_onnx, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(onnxtrain.InvalidArgument, match="'int8'"):
        _artifacts(bert_onnx, out, "int8")
    assert not out.exists()
    with pytest.raises(TypeError, match="mixed_precision"):
        _artifacts(bert_onnx, out, 16)
    assert not out.exists()


def test_checkpoint_of_another_mode_is_refused(bert_onnx, tmp_path):
    paths = {mode: _artifacts(bert_onnx, tmp_path / str(mode), mode) for mode in (None, "bf16", "fp16")}
    shown = {None: "fp32", "bf16": "mixed precision bf16", "fp16": "mixed precision fp16"}
    before = {mode: open(p[3], "rb").read() for mode, p in paths.items()}
    for ckpt_mode, graph_mode in ((None, "bf16"), ("bf16", None), (None, "fp16"), ("fp16", None), ("bf16", "fp16"),
                                  ("fp16", "bf16")):
        state = CheckpointState.load_checkpoint(paths[ckpt_mode][3])
        msg = f"saved for {shown[ckpt_mode]} training, the training model is {shown[graph_mode]}"
        with pytest.raises(onnxtrain.InvalidArgument, match=msg):
            Module(paths[graph_mode][0], state)
    for mode, p in paths.items():  # nothing on disk changed
        assert open(p[3], "rb").read() == before[mode]


def test_model_already_in_half_precision_is_named(tmp_path):
    w = helper.make_tensor("w", TensorProto.FLOAT16, [4, 3], np.ones(12, np.float16).view(np.uint16).tolist(), raw=False)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 3])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(onnxtrain.InvalidArgument, match="value 'x' is already float16"):
        artifacts.generate_artifacts(model, requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                     artifact_directory=str(tmp_path / "out"), mixed_precision="bf16")
    assert not (tmp_path / "out").exists()


def test_cli_mixed_precision_flag(bert_onnx, tmp_path):
    cli = str(ONNXTRAIN)
    out = tmp_path / "cli"
    r = subprocess.run([cli, "artifacts", bert_onnx[0], "--out", str(out), "--all", "--loss", "cross_entropy",
                        "--mixed-precision", "bf16"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    meta = {p.key: p.value for p in onnx.load(str(out / "training_model.onnx")).metadata_props}
    assert meta["onnxtrain.mixed_precision"] == "bf16"
    r = subprocess.run([cli, "artifacts", bert_onnx[0], "--out", str(tmp_path / "bad"), "--all", "--loss",
                        "cross_entropy", "--mixed-precision", "bf17"], capture_output=True, text=True)
    assert r.returncode != 0 and "'bf17'" in r.stderr
    assert not (tmp_path / "bad").exists()


def test_bf16_resume_is_bit_identical(bert_onnx, tmp_path):
    _, _, x, y = bert_onnx
    paths = _artifacts(bert_onnx, tmp_path / "a", "bf16")

    def run(state, steps):
        module = Module(paths[0], state, paths[1])
        optimizer = Optimizer(paths[2], module)
        for _ in range(steps):
            module(x, y)
            optimizer.step()
            module.lazy_reset_grad()
        return module

    straight = run(CheckpointState.load_checkpoint(paths[3]), 6).get_contiguous_parameters()
    state = CheckpointState.load_checkpoint(paths[3])
    run(state, 3)
    CheckpointState.save_checkpoint(state, tmp_path / "resume.ckpt", include_optimizer_state=True)
    resumed = run(CheckpointState.load_checkpoint(tmp_path / "resume.ckpt"), 3).get_contiguous_parameters()
    assert resumed.dtype == np.float32  # fp32 masters
    np.testing.assert_array_equal(resumed, straight)


# --------------------------------------------------------------------------------------------------
# fp16: the dynamic loss scaler

LOSS_SCALE, GOOD_STEPS, SKIPPED = "onnxtrain.loss_scale", "onnxtrain.loss_scale_good_steps", "onnxtrain.skipped_steps"


class ReferenceScaler:
    """torch.amp.GradScaler's update rule with its defaults, written out."""

    def __init__(self, scale=2.0 ** 16, good_steps=0):
        self.scale, self.good_steps, self.skipped = scale, good_steps, 0

    def update(self, finite):
        if not finite:
            self.scale *= 0.5
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps == 2000:
            self.scale *= 2.0
            self.good_steps = 0


def test_fp16_training_graph_and_checkpoint(bert_onnx, tmp_path):
    paths = _artifacts(bert_onnx, tmp_path, "fp16")
    m = onnx.load(paths[0])
    types = _dtypes(m.graph)
    meta = {p.key: p.value for p in m.metadata_props}
    assert meta["onnxtrain.mixed_precision"] == "fp16"
    assert meta["onnxtrain.loss_scale_input"] == "loss_scale"
    assert types["loss_scale"] == TensorProto.FLOAT
    _check_gemm_dtypes(m.graph, types, TensorProto.FLOAT16)
    for p in bert_onnx[1]:  # fp32 masters and fp32 unscaled gradients
        assert types[p] == TensorProto.FLOAT and types[p + "_grad"] == TensorProto.FLOAT
    state = CheckpointState.load_checkpoint(paths[3])
    assert (state.properties[LOSS_SCALE], state.properties[GOOD_STEPS], state.properties[SKIPPED]) == (65536.0, 0, 0)
    module = Module(paths[0], state, paths[1])
    assert "loss_scale" not in module.input_names()  # fed from the checkpoint, not by the caller


def test_fp16_curve_follows_fp32(bert_onnx, tmp_path):
    _, _, x, y = bert_onnx
    l32, _ = _train(_artifacts(bert_onnx, tmp_path / "fp32", None), x, y, 25)
    l16, eval16 = _train(_artifacts(bert_onnx, tmp_path / "fp16", "fp16"), x, y, 25)
    assert np.isfinite(l16).all()
    assert abs(l16[0] - l32[0]) < 0.005 * abs(l32[0])  # one fp16 forward: 3 more mantissa bits than bf16
    np.testing.assert_allclose(l16[::5], l32[::5], rtol=0.05, atol=0.02)
    assert np.asarray(eval16).dtype == np.float32


def _grads_finite(state, params):
    return all(np.isfinite(state.parameters[p].grad).all() for p in params)


def test_fp16_overflow_skips_updates_and_recovers(bert_onnx, tmp_path):
    _, params, x, y = bert_onnx
    paths = _artifacts(bert_onnx, tmp_path, "fp16")
    state = CheckpointState.load_checkpoint(paths[3])
    # A huge scale overflows fp16 in the backward; a count one short of 2000 makes the first
    # finite step double the scale.
    state.properties[LOSS_SCALE] = 2.0 ** 40
    state.properties[GOOD_STEPS] = 1999
    ref = ReferenceScaler(2.0 ** 40, 1999)
    module = Module(paths[0], state, paths[1])
    optimizer = Optimizer(paths[2], module)
    verdicts, losses = [], []
    for step in range(40):
        losses.append(float(module(x, y)))
        finite = _grads_finite(state, params)  # read before the optimizer looks
        before = module.get_contiguous_parameters()
        count = optimizer._optimizer.step_count()
        result = optimizer.step()
        ref.update(finite)
        verdicts.append(finite)
        assert result.skipped == (not finite), step
        assert result.loss_scale == ref.scale, step
        assert (state.properties[LOSS_SCALE], state.properties[GOOD_STEPS], state.properties[SKIPPED]) == \
            (ref.scale, ref.good_steps, ref.skipped), step
        after = module.get_contiguous_parameters()
        if result.skipped:  # nothing moved: parameters and the step count
            np.testing.assert_array_equal(after, before)
            assert optimizer._optimizer.step_count() == count
        else:
            assert not np.array_equal(after, before)
            assert optimizer._optimizer.step_count() == count + 1
        module.lazy_reset_grad()
    skips = verdicts.index(True)
    assert skips >= 10, verdicts  # 2^40 overflows fp16 (max 65504): halved at least ten times first
    assert ref.scale < 2.0 ** 30
    # Recovery: once updates run, the model learns the batch as an fp32 run does.
    assert losses[-1] < 0.5 * losses[skips], losses


def test_fp16_resume_is_bit_identical(bert_onnx, tmp_path):
    _, _, x, y = bert_onnx
    paths = _artifacts(bert_onnx, tmp_path / "a", "fp16")

    def start(state):
        state.properties[LOSS_SCALE] = 2.0 ** 21  # overflows for the first steps: skips on both sides of the save
        state.properties[GOOD_STEPS] = 1997       # and the scale doubles after the save
        return state

    def run(state, steps):
        module = Module(paths[0], state, paths[1])
        optimizer = Optimizer(paths[2], module)
        skipped = []
        for _ in range(steps):
            module(x, y)
            skipped.append(optimizer.step().skipped)
            module.lazy_reset_grad()
        return module.get_contiguous_parameters(), skipped

    straight_state = start(CheckpointState.load_checkpoint(paths[3]))
    straight, skipped_straight = run(straight_state, 8)
    state = start(CheckpointState.load_checkpoint(paths[3]))
    _, first = run(state, 4)
    CheckpointState.save_checkpoint(state, tmp_path / "resume.ckpt", include_optimizer_state=True)
    resumed_state = CheckpointState.load_checkpoint(tmp_path / "resume.ckpt")
    resumed, second = run(resumed_state, 4)
    assert first + second == skipped_straight
    assert any(first) and not all(skipped_straight), skipped_straight
    np.testing.assert_array_equal(resumed, straight)
    for key in (LOSS_SCALE, GOOD_STEPS, SKIPPED):
        assert resumed_state.properties[key] == straight_state.properties[key], key


def test_cli_fp16_train_prints_skipped_updates(bert_onnx, tmp_path):
    _, _, x, y = bert_onnx
    cli = str(ONNXTRAIN)
    r = subprocess.run([cli, "artifacts", bert_onnx[0], "--out", str(tmp_path / "art"), "--all", "--loss",
                        "cross_entropy", "--mixed-precision", "fp16"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ckpt = tmp_path / "art" / "checkpoint"
    state = CheckpointState.load_checkpoint(ckpt)
    state.properties[LOSS_SCALE] = 2.0 ** 30  # overflows: the first updates are skipped
    CheckpointState.save_checkpoint(state, ckpt)
    np.savez(tmp_path / "train.npz", x=np.tile(x, (3, 1)), y=np.tile(y, 3))
    r = subprocess.run([cli, "train", str(tmp_path / "art"), "--data", str(tmp_path / "train.npz"), "--inputs", "x",
                        "--labels", "y", "--batch-size", "4", "--epochs", "6", "--progress", "lines",
                        "--checkpoint-out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "skipped: a gradient overflowed in fp16" in line]
    out = CheckpointState.load_checkpoint(tmp_path / "out")
    assert len(lines) == out.properties[SKIPPED] >= 5, r.stderr
    assert lines[0].startswith("update 1 skipped") and "loss scale now 5.36871e+08" in lines[0]


def test_bf16_conv_and_pooling_run_low(tmp_path):
    """Conv is a low op and MaxPool follows: with a Relu between them (no fp32 op), the whole
    convolution block, forward and backward, runs in bf16 (through oneDNN where the CPU has it)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 1, 3, 3)) * 0.3).astype(np.float32), "conv.w")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "conv.b")
    w2 = numpy_helper.from_array((rng.standard_normal((36, 3)) * 0.2).astype(np.float32), "fc.w")
    nodes = [helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("MatMul", ["f", "fc.w"], ["logits"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [8, 3])],
                              initializer=[w, b, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    paths = artifacts.generate_artifacts(model, requires_grad=["conv.w", "conv.b", "fc.w"],
                                         loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.AdamW(lr=1e-2),
                                         artifact_directory=str(tmp_path), mixed_precision="bf16")
    g = onnx.load(paths[0]).graph
    types = _dtypes(g)
    ops = {n.op_type: n for n in g.node}
    for op in ("Conv", "ConvGrad", "MaxPool", "MaxPoolGrad"):
        assert all(types.get(v) == TensorProto.BFLOAT16 for v in ops[op].input if v), (op, list(ops[op].input))
    x = rng.standard_normal((8, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 8)
    l16, _ = _train(paths, x, y, 15)
    l32, _ = _train(artifacts.generate_artifacts(model, requires_grad=["conv.w", "conv.b", "fc.w"],
                                                 loss=artifacts.LossType.CrossEntropyLoss,
                                                 optimizer=artifacts.AdamW(lr=1e-2),
                                                 artifact_directory=str(tmp_path / "fp32")), x, y, 15)
    np.testing.assert_allclose(l16, l32, rtol=0.05, atol=0.02)
    assert l16[-1] < 0.7 * l16[0]


def _fused_matmul_model(output_dtype, a_type=TensorProto.BFLOAT16, m=24, k=40, n=16):
    """y = FusedMatMul(cast(a), cast(b)) with output_dtype, then a scalar loss of y."""
    nodes = [helper.make_node("Cast", ["a"], ["al"], to=a_type), helper.make_node("Cast", ["b"], ["bl"], to=a_type),
             helper.make_node("FusedMatMul", ["al", "bl"], ["y"], domain="onnxtrain", output_dtype=output_dtype)]
    g = helper.make_graph(nodes, "fmm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
                                         helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
                          [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("onnxtrain", 1)])


def _bf16_values(x):
    return torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy()


def test_fused_matmul_writes_fp32_accumulator():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 16)).astype(np.float32)
    exact = _bf16_values(a) @ _bf16_values(b)  # the product of the bf16 operands, in float64
    wide = onnxtrain.InferenceSession(_fused_matmul_model(1).SerializeToString()).run(None, {"a": a, "b": b})[0]
    narrow = onnxtrain.InferenceSession(_fused_matmul_model(0).SerializeToString()).run(None, {"a": a, "b": b})[0]
    assert wide.dtype == np.float32
    err_wide = np.abs(wide - exact).max() / np.abs(exact).max()
    err_narrow = np.abs(np.asarray(narrow, dtype=np.float32) - exact).max() / np.abs(exact).max()
    assert err_wide < 1e-5 < err_narrow  # fp32 accumulation, not rounded to bf16's 8 bits


def test_fused_matmul_fp32_output_gradient():
    """d/da sum(y * w) through an fp32 output of a bf16 product: dY is cast to bf16 and the
    gradient products run in bf16 (the rule emits the Cast); compared with float64."""
    model = _fused_matmul_model(1)
    g = model.graph
    g.output.pop()
    g.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [24, 16]))
    g.node.extend([helper.make_node("Mul", ["y", "w"], ["yw"]), helper.make_node("ReduceSum", ["yw"], ["loss"], keepdims=0)])
    g.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    grad = onnxtrain.autodiff.build_gradient_graph(model.SerializeToString(), ["a", "b"], ["loss"])
    ops = [n.op_type for n in onnx.load_from_string(grad).graph.node]
    assert ops.count("FusedMatMul") == 3
    rng = np.random.default_rng(4)
    a, b, w = (rng.standard_normal(s).astype(np.float32) for s in ((24, 40), (40, 16), (24, 16)))
    loss, da, db = onnxtrain.InferenceSession(grad).run(None, {"a": a, "b": b, "w": w})
    ab, bb, wb = _bf16_values(a), _bf16_values(b), _bf16_values(w)
    np.testing.assert_allclose(da, wb @ bb.T, rtol=0.02, atol=0.05)
    np.testing.assert_allclose(db, ab.T @ wb, rtol=0.02, atol=0.05)
    np.testing.assert_allclose(loss, (ab @ bb * w).sum(), rtol=1e-4)


def test_fused_matmul_output_dtype_bad_input():
    a, b = np.ones((24, 40), np.float32), np.ones((40, 16), np.float32)
    with pytest.raises(Exception, match="output_dtype"):  # fp32 A cannot be written as bf16
        onnxtrain.InferenceSession(_fused_matmul_model(TensorProto.BFLOAT16, a_type=TensorProto.FLOAT)
                                   .SerializeToString()).run(None, {"a": a, "b": b})
    with pytest.raises(Exception, match="output_dtype"):  # no int64 products
        onnxtrain.InferenceSession(_fused_matmul_model(TensorProto.INT64).SerializeToString()).run(None, {"a": a, "b": b})
