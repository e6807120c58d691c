"""CheckpointState from Python, and the checkpoint file read by an independent safetensors reader
written here from the public spec (8-byte LE header length, JSON header, raw LE data)."""
import json
import os
import resource
import signal
import struct

import numpy as np
import pytest

import onnxtrain
from onnxtrain import _C
from onnxtrain.api import CheckpointState, Parameter

# ---------------------------------------------------------------- an independent reader

_ST_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _CRC_TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in {keys}"
    return dict(pairs)


def read_safetensors(path):
    """Returns (tensors: {name: ndarray}, metadata: {str: str}, raw header dict), checking the
    layout as the spec requires."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob)
    header_bytes = blob[8:8 + n]
    assert header_bytes[:1] == b"{"
    header = json.loads(header_bytes.decode("utf-8"), object_pairs_hook=_no_duplicates)
    data = blob[8 + n:]
    metadata = header.get("__metadata__", {})
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    tensors, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert set(info) == {"dtype", "shape", "data_offsets"}
        begin, end = info["data_offsets"]
        dt = np.dtype(_ST_DTYPES[info["dtype"]])
        count = int(np.prod(info["shape"], dtype=np.int64))
        assert end - begin == count * dt.itemsize
        spans.append((begin, end))
        tensors[name] = np.frombuffer(data[begin:end], dtype=dt).reshape(info["shape"])
    spans.sort()
    pos = 0
    for begin, end in spans:
        assert begin == pos, "tensors must tile the data section"
        pos = end
    assert pos == len(data)
    return tensors, metadata, header


# ---------------------------------------------------------------- helpers


def make_state(rng=None):
    rng = rng or np.random.default_rng(0)
    s = _C.CheckpointState()
    s.add_parameter("fc.weight", rng.standard_normal((4, 3)).astype(np.float32), True)
    s.add_parameter("fc.bias", rng.standard_normal(4).astype(np.float32), True)
    s.add_parameter("layer/0/scale:0", rng.standard_normal((2, 2)).astype(np.float16), False)
    s.add_parameter("count", np.array(7, dtype=np.int64), False)
    s.add_parameter("mask", np.array([True, False, True]), False)
    return CheckpointState(s)


def onnx_model_bytes():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    b = numpy_helper.from_array(np.array([0.5, -0.5], dtype=np.float32), "b")
    shape = numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "shape")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y0"], transB=1),
             helper.make_node("Reshape", ["y0", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w, b, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


# ---------------------------------------------------------------- the Python API


def test_round_trip_and_independent_reader(tmp_path):
    state = make_state()
    state.properties["epoch"] = 3
    state.properties["loss"] = 0.25
    state.properties["note"] = "héllo \"world\"\n"
    path = tmp_path / "ckpt"
    CheckpointState.save_checkpoint(state, path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]

    tensors, metadata, header = read_safetensors(path)
    assert list(tensors) == ["fc.weight", "fc.bias", "layer/0/scale:0", "count", "mask"]
    for name, arr in tensors.items():
        np.testing.assert_array_equal(arr, state.parameters[name].data)
    assert tensors["layer/0/scale:0"].dtype == np.float16
    assert metadata["onnxtrain.format_version"] == "1"
    params_meta = json.loads(metadata["onnxtrain.parameters"])
    assert [p["requires_grad"] for p in params_meta] == [True, True, False, False, False]
    assert json.loads(metadata["onnxtrain.property.epoch"]) == {"type": "int", "value": 3}
    assert json.loads(metadata["onnxtrain.property.note"])["value"] == "héllo \"world\"\n"
    # Both checksums can be recomputed from the spec alone.
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert (8 + n) % 8 == 0
    assert metadata["onnxtrain.data_crc32c"] == f"{crc32c(blob[8 + n:]):08x}"
    stored = header["__metadata__"].pop("onnxtrain.header_crc32c")
    canonical = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert stored == f"{crc32c(canonical):08x}"

    loaded = CheckpointState.load_checkpoint(str(path))
    assert len(loaded.parameters) == 5
    assert [n for n, _ in loaded.parameters] == list(tensors)
    for name, p in loaded.parameters:
        assert isinstance(p, Parameter) and p.name == name
        np.testing.assert_array_equal(p.data, state.parameters[name].data)
        assert p.data.dtype == state.parameters[name].data.dtype
        assert p.grad is None
    assert loaded.parameters["fc.weight"].requires_grad
    assert not loaded.parameters["count"].requires_grad
    assert loaded.parameters["fc.weight"].shape == (4, 3)
    assert loaded.parameters["fc.weight"].dtype == "float32"
    assert dict(loaded.properties.items()) == {"epoch": 3, "loss": 0.25, "note": "héllo \"world\"\n"}
    assert type(loaded.properties["epoch"]) is int and type(loaded.properties["loss"]) is float
    assert loaded["epoch"] == 3 and "epoch" in loaded


def test_parameters_mapping_and_checks():
    state = make_state()
    params = state.parameters
    assert "fc.weight" in params and "nope" not in params and 3 not in params
    assert params.keys() == ["fc.weight", "fc.bias", "layer/0/scale:0", "count", "mask"]
    assert len(params.values()) == 5 and params.get("nope") is None
    with pytest.raises(KeyError, match="no parameter named 'nope'"):
        params["nope"]

    w = params["fc.weight"]
    new = np.full((4, 3), 1.5, dtype=np.float32)
    w.data = new
    np.testing.assert_array_equal(params["fc.weight"].data, new)
    view = w.data
    view[:] = 0  # a copy: the parameter is unchanged
    np.testing.assert_array_equal(w.data, new)
    params["fc.bias"] = [1, 2, 3, 4]  # non-arrays convert to the parameter's dtype
    np.testing.assert_array_equal(params["fc.bias"].data, np.array([1, 2, 3, 4], np.float32))
    w.data = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(4, 3))
    np.testing.assert_array_equal(w.data, np.arange(12, dtype=np.float32).reshape(4, 3))

    with pytest.raises(onnxtrain.InvalidArgument,
                       match=r"parameter 'fc.weight': data expected float32 \[4, 3\], got float32 \[3, 4\]"):
        w.data = np.zeros((3, 4), np.float32)
    with pytest.raises(onnxtrain.InvalidArgument, match=r"expected float32 \[4, 3\], got float64 \[4, 3\]"):
        w.data = np.zeros((4, 3), np.float64)
    with pytest.raises(onnxtrain.InvalidArgument, match="not supported"):
        w.data = np.array([["a"] * 3] * 4, dtype=object)
    assert "fc.weight" in repr(w)


def test_properties_types():
    state = make_state()
    props = state.properties
    props["i"] = 2 ** 63 - 1
    props["n"] = np.int32(-5)
    props["f"] = float("inf")
    props["g"] = np.float32(0.5)
    props["s"] = ""
    assert props["i"] == 2 ** 63 - 1 and props["n"] == -5 and props["f"] == float("inf") and props["g"] == 0.5
    assert len(props) == 5 and "s" in props and [k for k, _ in props] == sorted(props.keys())
    for bad in ([1], None, b"x", True, np.bool_(False), {"a": 1}, 1 + 2j):
        with pytest.raises(TypeError, match="property 'x'"):
            props["x"] = bad
    with pytest.raises(OverflowError):
        props["x"] = 2 ** 64
    with pytest.raises(KeyError, match="no property named 'missing'"):
        props["missing"]
    del props["s"]
    assert "s" not in props
    with pytest.raises(KeyError):
        del props["s"]


def test_optimizer_state_is_optional(tmp_path):
    state = make_state()
    native = state._state
    native.set_optimizer_tensor("fc.weight", "exp_avg", np.ones((4, 3), np.float32))
    native.set_optimizer_tensor("fc.weight", "exp_avg_sq", np.full((4, 3), 2, np.float32))
    native.optimizer_step = 42
    native.optimizer_learning_rate = 1e-3
    CheckpointState.save_checkpoint(state, tmp_path / "without")  # ORT's default: no optimizer state
    CheckpointState.save_checkpoint(state, tmp_path / "with", include_optimizer_state=True)

    tensors, metadata, _ = read_safetensors(tmp_path / "with")
    np.testing.assert_array_equal(tensors["__optimizer__/fc.weight/exp_avg_sq"], np.full((4, 3), 2, np.float32))
    assert json.loads(metadata["onnxtrain.optimizer"]) == {"step": 42, "learning_rate": 0.001}
    loaded = CheckpointState.load_checkpoint(tmp_path / "with")
    assert loaded._state.optimizer_step == 42
    assert loaded._state.optimizer_learning_rate == 1e-3
    np.testing.assert_array_equal(loaded._state.get_optimizer_state()["fc.weight"]["exp_avg"], np.ones((4, 3)))
    assert len(loaded.parameters) == 5  # optimizer tensors are not parameters

    without = CheckpointState.load_checkpoint(tmp_path / "without")
    assert not without._state.has_optimizer_state()
    assert not any(k.startswith("__optimizer__") for k in read_safetensors(tmp_path / "without")[0])


def test_from_onnx_model_nominal_and_buffer(tmp_path):
    model = onnx_model_bytes()
    full = CheckpointState.from_onnx_model(model, requires_grad=["w", "b"])
    assert full.parameters.keys() == ["w", "b", "shape"]
    assert [p.requires_grad for _, p in full.parameters] == [True, True, False]
    buf = full.to_contiguous_buffer()
    np.testing.assert_array_equal(buf, np.array([0, 1, 2, 3, 4, 5, 0.5, -0.5], np.float32))

    nominal = CheckpointState.from_onnx_model(model, requires_grad=["w", "b"], nominal=True)
    assert nominal.is_nominal() and "nominal" in repr(nominal.parameters["w"])
    with pytest.raises(onnxtrain.InvalidArgument, match="parameter 'w' has no data"):
        nominal.parameters["w"].data
    CheckpointState.save_checkpoint(nominal, tmp_path / "nominal")
    tensors, metadata, _ = read_safetensors(tmp_path / "nominal")
    assert tensors == {}  # shapes live in the metadata only
    assert json.loads(metadata["onnxtrain.parameters"])[0] == {
        "name": "w", "requires_grad": True, "dtype": "F32", "shape": [2, 3]}
    loaded = CheckpointState.load_checkpoint(tmp_path / "nominal")
    assert loaded.is_nominal() and loaded.parameters["w"].shape == (2, 3)
    with pytest.raises(onnxtrain.InvalidArgument, match="1-D float32 buffer of 8 elements"):
        loaded.fill_parameters_from_buffer(buf[:7])
    loaded.fill_parameters_from_buffer(buf)
    np.testing.assert_array_equal(loaded.parameters["w"].data, np.arange(6, dtype=np.float32).reshape(2, 3))
    loaded.parameters["shape"].data = np.array([1, 2], np.int64)
    assert not loaded.is_nominal()

    with pytest.raises(onnxtrain.InvalidArgument, match="'nope' is not an initializer"):
        CheckpointState.from_onnx_model(model, requires_grad=["nope"])
    with pytest.raises(TypeError):
        CheckpointState.from_onnx_model(model, requires_grad="w")
    with pytest.raises(TypeError):
        CheckpointState("not a state")


def test_foreign_safetensors_file_loads(tmp_path):
    # As another safetensors writer would lay it out: no onnxtrain metadata.
    a = np.arange(6, dtype=np.float64).reshape(3, 2)
    ids = np.array([1, 2, 3], np.int32)
    header = {"__metadata__": {"format": "np"},
              "ids": {"dtype": "I32", "shape": [3], "data_offsets": [48, 60]},
              "a": {"dtype": "F64", "shape": [3, 2], "data_offsets": [0, 48]}}
    hb = json.dumps(header).encode()
    (tmp_path / "foreign.safetensors").write_bytes(struct.pack("<Q", len(hb)) + hb + a.tobytes() + ids.tobytes())
    state = CheckpointState.load_checkpoint(tmp_path / "foreign.safetensors")
    np.testing.assert_array_equal(state.parameters["a"].data, a)
    np.testing.assert_array_equal(state.parameters["ids"].data, ids)
    assert state.parameters["a"].requires_grad and not state.parameters["ids"].requires_grad


# ---------------------------------------------------------------- errors


def test_corrupt_files_are_clear_errors(tmp_path):
    state = make_state()
    path = tmp_path / "ckpt"
    CheckpointState.save_checkpoint(state, path)
    good = path.read_bytes()
    bad = tmp_path / "bad"

    bad.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(onnxtrain.InvalidModel, match=r"checkpoint '.*bad': data checksum mismatch"):
        CheckpointState.load_checkpoint(bad)
    i = good.index(b'"shape":[4,3]') + 9
    bad.write_bytes(good[:i] + b"5" + good[i + 1:])
    with pytest.raises(onnxtrain.InvalidModel, match="checkpoint '.*bad': "):
        CheckpointState.load_checkpoint(bad)
    bad.write_bytes(good[:100])
    with pytest.raises(onnxtrain.InvalidModel, match="runs past the end of the file"):
        CheckpointState.load_checkpoint(bad)
    bad.write_bytes(b"\x00" * 3)
    with pytest.raises(onnxtrain.InvalidModel, match="too short"):
        CheckpointState.load_checkpoint(bad)
    bad.write_bytes(good)
    for cut in range(len(good) - 1, -1, -7):  # shrink one file in place
        os.truncate(bad, cut)
        with pytest.raises(onnxtrain.Error, match=str(bad)):
            CheckpointState.load_checkpoint(bad)
    with pytest.raises(onnxtrain.Error, match="cannot open"):
        CheckpointState.load_checkpoint(tmp_path / "missing")
    with pytest.raises(TypeError):
        CheckpointState.load_checkpoint(42)


def test_failed_save_keeps_old_file(tmp_path):
    state = make_state()
    path = tmp_path / "ckpt"
    CheckpointState.save_checkpoint(state, path)
    old = path.read_bytes()

    big = CheckpointState(_C.CheckpointState())
    big._state.add_parameter("w", np.zeros(1 << 18, np.float32), True)  # 1 MiB
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
        with pytest.raises(onnxtrain.Error, match=r"checkpoint '.*ckpt': cannot write temporary file"):
            CheckpointState.save_checkpoint(big, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert path.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]

    with pytest.raises(onnxtrain.Error, match="cannot create temporary file"):
        CheckpointState.save_checkpoint(state, tmp_path / "no" / "dir" / "ckpt")
