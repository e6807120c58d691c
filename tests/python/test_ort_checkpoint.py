"""ONNX Runtime's training checkpoints, both ways, against the real ONNX Runtime training 1.19.2
(the `ort-training` peer, run in its own interpreter): checkpoints ORT writes (fresh from
generate_artifacts, after optimizer steps, nominal) load in onnxtrain with exactly ORT's values;
checkpoints onnxtrain writes with format="ort" load in ORT's CheckpointState.load_checkpoint with
exactly onnxtrain's values, and ORT continues training from them as from its own. ORT's side is
read by ORT itself: parameters and properties through its training API, optimizer groups through
the flatbuffer classes its wheel ships (onnxruntime/tools/ort_format_model)."""
import json
import os
import subprocess
import textwrap

import numpy as np
import pytest

import peers
from onnxtrain import _C
from onnxtrain.api import CheckpointState

from .build_paths import ONNXTRAIN

PEER_SCRIPT = textwrap.dedent(r"""
    import json, os, sys
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def mlp():
        rng = np.random.default_rng(0)
        inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
                 for n, s in [("w1", (8, 16)), ("b1", (16,)), ("w2", (16, 4)), ("b2", (4,))]]
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
                 helper.make_node("Relu", ["h1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y0"]),
                 helper.make_node("Add", ["y0", "b2"], ["logits"])]
        graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=7)

    def batch(step):
        rng = np.random.default_rng(100 + step)
        return rng.standard_normal((16, 8)).astype(np.float32), rng.integers(0, 4, 16).astype(np.int64)

    def train(art, ckpt, steps, first_step, out):
        from onnxruntime.training.api import CheckpointState, Module, Optimizer
        state = CheckpointState.load_checkpoint(ckpt)
        module = Module(art + "/training_model.onnx", state, art + "/eval_model.onnx")
        optimizer = Optimizer(art + "/optimizer_model.onnx", module)
        module.train()
        losses = []
        for k in range(steps):
            losses.append(float(module(*batch(first_step + k))))
            optimizer.step()
            module.lazy_reset_grad()
        state.properties["epoch"] = first_step + steps
        state.properties["best"] = 0.5
        state.properties["tag"] = "ort"
        CheckpointState.save_checkpoint(state, out, include_optimizer_state=True)
        return losses

    def dump(ckpt, out):
        # Parameters and properties as ORT's API loads them; the optimizer group through ORT's own
        # flatbuffer classes (the API does not expose moments).
        from onnxruntime.training.api import CheckpointState
        from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import Checkpoint
        state = CheckpointState.load_checkpoint(ckpt)
        buf = open(ckpt, "rb").read()
        c = Checkpoint.Checkpoint.GetRootAs(buf, 0)
        ms = c.ModuleState()
        arrays, meta = {}, {"params": {}, "properties": {}}
        meta["version"] = c.Version()
        meta["nominal"] = bool(ms.IsNominalState())
        meta["external"] = bool(ms.HasExternalData())
        if meta["nominal"]:  # ORT's API gives no parameter of a nominal state: names from the file
            for i in range(ms.RequiresGradParamsLength()):
                meta["params"][ms.RequiresGradParams(i).Name().decode()] = True
            for i in range(ms.FrozenParamsLength()):
                meta["params"][ms.FrozenParams(i).Name().decode()] = False
        else:
            for name, p in state.parameters:
                meta["params"][name] = p.requires_grad
                arrays["param/" + name] = p.data
        for k, v in state.properties:
            meta["properties"][k] = v
        meta["groups"] = []
        ext = open(ckpt + ".data", "rb").read() if meta["external"] else b""
        for g in range(c.OptimizerGroupsLength()):
            og = c.OptimizerGroups(g)
            meta["groups"].append({"name": og.GroupName().decode(), "step": og.Step(), "lr": og.InitialLearningRate()})
            for i in range(og.OptimizerStatesLength()):
                s = og.OptimizerStates(i)
                for j in range(s.MomentumsLength()):
                    t = s.Momentums(j)
                    dims = tuple(t.DimsAsNumpy())
                    if t.ExternalDataOffset() >= 0:
                        n = int(np.prod(dims)) * 4
                        data = np.frombuffer(ext[t.ExternalDataOffset():t.ExternalDataOffset() + n], np.float32)
                    else:
                        data = t.RawDataAsNumpy().view(np.float32)
                    arrays["momentum/%s/%s" % (s.ParamName().decode(), t.Name().decode())] = data.reshape(dims)
        np.savez(out + ".npz", **arrays)
        with open(out + ".json", "w") as f:
            json.dump(meta, f)

    cmd = sys.argv[1]
    if cmd == "make":
        from onnxruntime.training import artifacts
        art = sys.argv[2]
        os.makedirs(art, exist_ok=True)
        artifacts.generate_artifacts(mlp(), requires_grad=["w1", "b1", "w2"], frozen_params=["b2"],
                                     loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=art, nominal_checkpoint=True)
        onnx.save(mlp(), art + "/mlp.onnx")
        print(json.dumps(train(art, art + "/checkpoint", 4, 0, art + "/trained")))
    elif cmd == "train":
        print(json.dumps(train(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])))
    elif cmd == "dump":
        dump(sys.argv[2], sys.argv[3])
    elif cmd == "nominal_module":
        # A nominal checkpoint must feed a Module, which then takes the parameters from a buffer.
        from onnxruntime import OrtValue
        from onnxruntime.training.api import CheckpointState, Module
        art = sys.argv[2]
        state = CheckpointState.load_checkpoint(sys.argv[3])
        module = Module(art + "/training_model.onnx", state, art + "/eval_model.onnx")
        n = module.get_parameters_size(False)
        module.copy_buffer_to_parameters(OrtValue.ortvalue_from_numpy(np.arange(n, dtype=np.float32))._ortvalue, False)
        print(json.dumps(n))
""")


def peer(*args):
    proc = peers.run("ort-training", ["-c", PEER_SCRIPT, *map(str, args)], timeout_s=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout.strip().splitlines()
    return json.loads(out[-1]) if out else None


def ort_view(path, tmp):
    """What ONNX Runtime reads from the checkpoint at path: (arrays, metadata)."""
    stem = str(tmp / (os.path.basename(str(path)) + ".dump"))
    peer("dump", path, stem)
    with np.load(stem + ".npz") as z:
        arrays = {k: z[k] for k in z.files}
    with open(stem + ".json") as f:
        return arrays, json.load(f)


ORT_NAMES = {"exp_avg": "momentum0", "exp_avg_sq": "momentum1"}


def onnxtrain_view(state):
    """The same view of an onnxtrain CheckpointState, under ORT's names."""
    arrays = {"param/" + n: p.data for n, p in state.parameters if state._state.parameter_info(n)[3]}
    if state._state.has_optimizer_state():
        for param, states in state._state.get_optimizer_state().items():
            for name, t in states.items():
                arrays[f"momentum/{param}/{ORT_NAMES.get(name, name)}"] = t
    return arrays


def assert_same_arrays(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k  # bit-exact: nothing is recomputed on either side


@pytest.fixture(scope="module")
def art(tmp_path_factory, ort_training_peer):
    """ORT's artifacts for a 2-layer MLP (b2 frozen), its fresh and nominal checkpoints, and
    `trained`: the checkpoint after 4 AdamW steps, with int, float and string properties."""
    d = tmp_path_factory.mktemp("ort_ckpt")
    peer("make", d / "art")
    return d / "art"


def test_ort_fresh_checkpoint_loads_with_ort_values(art, tmp_path):
    state = CheckpointState.load_checkpoint(art / "checkpoint")
    assert CheckpointState.checkpoint_format(art / "checkpoint") == "ort"
    arrays, meta = ort_view(art / "checkpoint", tmp_path)
    assert meta["version"] == 2 and not meta["nominal"] and not meta["groups"]
    assert_same_arrays(onnxtrain_view(state), arrays)
    assert {n: p.requires_grad for n, p in state.parameters} == meta["params"] == {
        "w1": True, "b1": True, "w2": True, "b2": False}
    assert not state._state.has_optimizer_state()


def test_ort_trained_checkpoint_loads_with_ort_params_moments_and_properties(art, tmp_path):
    state = CheckpointState.load_checkpoint(art / "trained")
    arrays, meta = ort_view(art / "trained", tmp_path)
    assert len([k for k in arrays if k.startswith("momentum/")]) == 6  # momentum0/1 of w1, b1, w2
    # Under the names onnxtrain's AdamW reads (so an onnxtrain Optimizer resumes from them).
    assert {p: sorted(s) for p, s in state._state.get_optimizer_state().items()} == {
        p: ["exp_avg", "exp_avg_sq"] for p in ("w1", "b1", "w2")}
    assert_same_arrays(onnxtrain_view(state), arrays)
    (group,) = meta["groups"]
    assert state._state.optimizer_step == group["step"] == 4
    assert state._state.optimizer_learning_rate == group["lr"]  # float32 in the file, exact as a double
    assert dict(state.properties) == meta["properties"] == {
        "epoch": 4, "best": 0.5, "tag": "ort"}


def test_ort_nominal_checkpoint_loads_without_shapes(art, tmp_path):
    state = CheckpointState.load_checkpoint(art / "nominal_checkpoint")
    _, meta = ort_view(art / "nominal_checkpoint", tmp_path)
    assert meta["nominal"] and state.is_nominal()
    assert {n: p.requires_grad for n, p in state.parameters} == meta["params"]
    assert all(p.shape is None and p.dtype == "float32" for _, p in state.parameters)
    with pytest.raises(Exception, match="has no shape"):
        state.to_contiguous_buffer()
    # ORT reads it back as nominal as written by onnxtrain, and a Module takes a buffer for it.
    CheckpointState.save_checkpoint(state, tmp_path / "nominal", format="ort")
    assert peer("nominal_module", art, tmp_path / "nominal") == 8 * 16 + 16 + 16 * 4 + 4


def test_onnxtrain_ort_checkpoint_loads_in_ort_with_the_same_values(art, tmp_path):
    state = CheckpointState.load_checkpoint(art / "trained")
    # Values of onnxtrain's own, so nothing can pass by copying ORT's file through.
    rng = np.random.default_rng(5)
    for name, p in state.parameters:
        state.parameters[name] = (p.data + rng.standard_normal(p.data.shape)).astype(np.float32)
    for param, states in state._state.get_optimizer_state().items():
        for sname, t in states.items():
            state._state.set_optimizer_tensor(param, sname, np.abs(rng.standard_normal(t.shape)).astype(np.float32))
    state._state.optimizer_step = 17
    state.properties["epoch"] = 9
    state.properties["tag"] = "onnxtrain"
    CheckpointState.save_checkpoint(state, tmp_path / "ours", include_optimizer_state=True, format="ort")
    arrays, meta = ort_view(tmp_path / "ours", tmp_path)
    assert_same_arrays(onnxtrain_view(state), arrays)
    assert meta["groups"] == [{"name": "group0", "step": 17, "lr": state._state.optimizer_learning_rate}]
    assert meta["properties"] == {"epoch": 9, "best": 0.5, "tag": "onnxtrain"}
    assert meta["params"] == {"b1": True, "w1": True, "w2": True, "b2": False}


def test_ort_continues_training_from_an_onnxtrain_checkpoint_as_from_its_own(art, tmp_path):
    # Reference: ORT trains 3 more steps from its own checkpoint.
    ref_losses = peer("train", art, art / "trained", 3, 4, tmp_path / "ref")
    # The same from the checkpoint onnxtrain read and wrote again (through its own format too).
    state = CheckpointState.load_checkpoint(art / "trained")
    CheckpointState.save_checkpoint(state, tmp_path / "ours.ot", include_optimizer_state=True)
    CheckpointState.save_checkpoint(CheckpointState.load_checkpoint(tmp_path / "ours.ot"), tmp_path / "ours",
                                    include_optimizer_state=True, format="ort")
    losses = peer("train", art, tmp_path / "ours", 3, 4, tmp_path / "continued")
    assert losses == ref_losses
    ref, _ = ort_view(tmp_path / "ref", tmp_path)
    got, _ = ort_view(tmp_path / "continued", tmp_path)
    assert_same_arrays(got, ref)
    # And onnxtrain reads ORT's continued checkpoint as ORT does.
    assert_same_arrays(onnxtrain_view(CheckpointState.load_checkpoint(tmp_path / "continued")), got)


def test_convert_checkpoint_cli_both_ways(art, tmp_path):
    def cli(*args, check=True):
        r = subprocess.run([str(ONNXTRAIN), "convert-checkpoint", *map(str, args)], capture_output=True, text=True,
                           timeout=120)
        assert (r.returncode == 0) == check, r.stderr
        return r

    r = cli(art / "trained", tmp_path / "ours.ckpt")  # no --to: the other format
    assert "(ort) -> " in r.stdout and "(onnxtrain): 4 parameters, 3 properties, optimizer state" in r.stdout
    assert CheckpointState.checkpoint_format(tmp_path / "ours.ckpt") == "onnxtrain"
    # The name says nothing: a file called .onnx is read by its bytes.
    r = cli(tmp_path / "ours.ckpt", tmp_path / "back.onnx", "--to", "ort")
    assert CheckpointState.checkpoint_format(tmp_path / "back.onnx") == "ort"
    assert_same_arrays(ort_view(tmp_path / "back.onnx", tmp_path)[0], ort_view(art / "trained", tmp_path)[0])
    cli(art / "trained", tmp_path / "noopt", "--no-optimizer-state")
    assert not CheckpointState.load_checkpoint(tmp_path / "noopt")._state.has_optimizer_state()
    # Bad input: a clear error naming the file, exit 1, nothing written.
    bad = tmp_path / "bad"
    bad.write_bytes((art / "trained").read_bytes()[:500])
    r = cli(bad, tmp_path / "never", check=False)
    assert r.returncode == 1 and str(bad) in r.stderr and "ONNX Runtime format" in r.stderr, r.stderr
    assert not (tmp_path / "never").exists()
    r = cli(art / "trained", tmp_path / "x", "--to", "tflite", check=False)
    assert r.returncode == 2 and "--to" in r.stderr


def test_ort_checkpoint_of_another_model_is_refused_by_module(art, tmp_path):
    from onnxtrain import artifacts as ot_artifacts
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(art / "mlp.onnx"))
    for init in model.graph.initializer:  # the same names, other shapes: w1 8x16 -> 8x12 ...
        a = numpy_helper.to_array(init)
        if init.name in ("w1", "b1"):
            a = a[..., :12]
        elif init.name == "w2":
            a = a[:12]
        init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(a), init.name))
    ot_artifacts.generate_artifacts(model, requires_grad=["w1", "b1", "w2"], loss=ot_artifacts.LossType.CrossEntropyLoss,
                                    optimizer=ot_artifacts.OptimType.AdamW, artifact_directory=str(tmp_path / "small"))
    from onnxtrain.api import Module
    state = CheckpointState.load_checkpoint(art / "trained")
    with pytest.raises(Exception) as e:
        Module(str(tmp_path / "small" / "training_model.onnx"), state, str(tmp_path / "small" / "eval_model.onnx"))
    assert "the checkpoint belongs to another model" in str(e.value), str(e.value)


def test_external_data_loads_in_ort(art, tmp_path):
    """Version 2 with every tensor of 64 bytes or more in `<path>.data` (what a checkpoint past
    2 GiB needs; the threshold is lowered to 0 here) loads in ORT with the same values, and ORT
    trains on from it as from its own."""
    state = CheckpointState.load_checkpoint(art / "trained")
    state._state._save_ort(str(tmp_path / "ckpt"), True, 2, 0)
    assert (tmp_path / "ckpt.data").stat().st_size > (tmp_path / "ckpt").stat().st_size
    arrays, meta = ort_view(tmp_path / "ckpt", tmp_path)
    assert meta["version"] == 2 and meta["external"]
    assert_same_arrays(onnxtrain_view(state), arrays)
    assert_same_arrays(onnxtrain_view(CheckpointState.load_checkpoint(tmp_path / "ckpt")), arrays)
    ref_losses = peer("train", art, art / "trained", 2, 4, tmp_path / "ref")
    assert peer("train", art, tmp_path / "ckpt", 2, 4, tmp_path / "continued") == ref_losses
    assert_same_arrays(ort_view(tmp_path / "continued", tmp_path)[0], ort_view(tmp_path / "ref", tmp_path)[0])


def test_version_1_is_read_here_and_refused_by_ort_1_19(art, tmp_path):
    """Version 1 is ORT 1.16/1.17's layout: onnxtrain reads and writes it (for apps that ship
    those), ORT 1.19.2 refuses it by name."""
    state = CheckpointState.load_checkpoint(art / "trained")
    state._state._save_ort(str(tmp_path / "v1"), True, 1, 0)
    assert not (tmp_path / "ckpt.data").exists()
    assert_same_arrays(onnxtrain_view(CheckpointState.load_checkpoint(tmp_path / "v1")), onnxtrain_view(state))
    proc = peers.run("ort-training", ["-c", PEER_SCRIPT, "dump", str(tmp_path / "v1"), str(tmp_path / "v1.dump")])
    assert proc.returncode != 0 and "Checkpoint version 1 is not supported" in proc.stderr, proc.stderr[-2000:]
