#!/usr/bin/env python3
"""Seed corpora for the fuzz targets (tests/fuzz, docs/ROBUSTNESS.md "Fuzzing"), made from the files
the tests make: the ONNX conformance run's models (onnx's own node test generators), the MLP the C++
tests train, the artifacts, checkpoints (onnxtrain's and ONNX Runtime's format), pre-compiled .otc
models and LoRA artifacts the CLI makes from it, numpy .npz/.npy data as numpy writes it, and the
JSON those files hold. Written to ~/.cache/onnxtrain/fuzz/<target>/seeds, outside the repository
(ONNXTRAIN_FUZZ_CACHE moves it). Needs the normal build (build/onnxtrain and build/python).

    PYTHONPATH=build/python /usr/bin/python3 tests/fuzz/make_seeds.py [BUILD_DIR]
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import warnings

import numpy as np

# onnx 1.12's generators use aliases that numpy 1.24 removed (as tests/conformance does).
for _alias, _type in [("float", float), ("int", int), ("bool", bool), ("object", object),
                      ("complex", complex), ("str", str)]:
    if _alias not in np.__dict__:
        setattr(np, _alias, _type)
warnings.filterwarnings("ignore")

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
CLI = os.path.join(BUILD, "onnxtrain")
CACHE = os.environ.get("ONNXTRAIN_FUZZ_CACHE", os.path.expanduser("~/.cache/onnxtrain/fuzz"))
MLP = os.path.join(ROOT, "tests", "models", "mlp_classifier.onnx")
# Seeds larger than this slow every fuzzing iteration and teach the fuzzer little more.
MAX_SEED_BYTES = 256 << 10

counts = {}  # target -> seeds written this run


def seed(target, data, name=None):
    if isinstance(data, str):
        data = data.encode()
    if len(data) > MAX_SEED_BYTES:
        return
    folder = os.path.join(CACHE, target, "seeds")
    os.makedirs(folder, exist_ok=True)
    name = name or hashlib.sha1(data).hexdigest()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
    counts[target] = counts.get(target, 0) + 1


def read(path):
    with open(path, "rb") as f:
        return f.read()


def cli(*args):
    subprocess.run([CLI, *args], check=True, stdout=subprocess.DEVNULL)


def model_seeds():
    import onnx.backend.test.case.node as node_cases
    for case in node_cases.collect_testcases(None):
        data = case.model.SerializeToString()
        for target in ("model_protobuf", "model_wire", "model_run"):
            seed(target, data)
    # A model whose initializer is external data in the targets' scratch "weights.bin" (4 KiB).
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "weights.bin"), ("offset", "0"), ("length", "64")):
        w.external_data.add(key=k, value=v)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "external",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    external = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    for target in ("model_protobuf", "model_wire"):
        seed(target, external)
        seed(target, read(MLP))
    seed("model_run", read(MLP))


def artifact_seeds(tmp):
    art = os.path.join(tmp, "art")
    cli("artifacts", MLP, "--out", art, "--all", "--loss", "cross_entropy")
    for f in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        seed("model_protobuf", read(os.path.join(art, f)))
        seed("model_wire", read(os.path.join(art, f)))
    rng = np.random.default_rng(0)
    data = os.path.join(tmp, "data.npz")
    np.savez(data, x=rng.standard_normal((16, 2)).astype(np.float32), target=rng.integers(0, 3, 16))
    cli("train", art, "--data", data, "--batch-size", "8", "--progress", "none",
        "--checkpoint-out", os.path.join(tmp, "trained"))
    for name in ("checkpoint", "trained"):
        path = os.path.join(art if name == "checkpoint" else tmp, name)
        seed("checkpoint", read(path))
        ort = path + ".ort"
        cli("convert-checkpoint", path, ort, "--to", "ort")
        seed("ort_checkpoint", read(ort))
        seed("checkpoint", read(ort))
        header_len = struct.unpack("<Q", read(path)[:8])[0]
        seed("json", read(path)[8:8 + header_len].rstrip(b" "))
        header = json.loads(read(path)[8:8 + header_len])
        for k, v in header.get("__metadata__", {}).items():
            if v.startswith(("[", "{")):
                seed("json", v)
    cli("compile", art, "--shape", "x=4,2", "--shape", "target=4")
    for f in ("training_model.otc", "eval_model.otc", "optimizer_model.otc"):
        seed("otc", read(os.path.join(art, f)))
    lora = os.path.join(tmp, "lora")
    cli("artifacts", MLP, "--out", lora, "--lora-target", "fc1,fc2,fc3", "--lora-rank", "2", "--loss", "cross_entropy")
    seed("checkpoint", read(os.path.join(lora, "checkpoint")))
    for f in ("training_model.onnx", "eval_model.onnx"):
        m = onnx.load(os.path.join(lora, f))
        seed("model_protobuf", m.SerializeToString())
        for p in m.metadata_props:
            if p.key == "onnxtrain.lora":
                seed("lora", p.value)
            if p.value.startswith(("[", "{")):
                seed("json", p.value)


def npz_seeds(tmp):
    rng = np.random.default_rng(0)
    arrays = {"f32": rng.standard_normal((3, 4)).astype(np.float32), "i64": np.arange(6).reshape(2, 3),
              "f16": np.ones(5, np.float16), "b": np.array([True, False]), "u8": np.arange(4, dtype=np.uint8),
              "scalar": np.float64(1.5), "empty": np.zeros((0, 3), np.float32), "be": np.arange(3, dtype=">i4")}
    for i, (k, v) in enumerate(arrays.items()):
        path = os.path.join(tmp, f"{i}.npy")
        np.save(path, v)
        seed("npz", read(path))
    for writer in (np.savez, np.savez_compressed):
        path = os.path.join(tmp, "a.npz")
        writer(path, **arrays)
        seed("npz", read(path))
        writer(path, x=arrays["f32"])
        seed("npz", read(path))


def text_seeds():
    for text in ('{"a": [1, 2.5, -3e-7, "x\\u00e9\\ud83d\\ude00"], "b": {"c": null, "d": true}}', "[]", "0",
                 '"\\u0000"', "[1e308, -0, 123456789012345678901234567890]"):
        seed("json", text)
    for n, lines in ((16, "location=weights.bin\noffset=0\nlength=64"), (4, "location=sub/weights.bin\noffset=4080"),
                     (8, "location=escape/secret.bin"), (1, "location=weights.bin\nlength=4")):
        seed("external_data", bytes([n]) + lines.encode())


def main():
    with tempfile.TemporaryDirectory() as tmp:
        model_seeds()
        artifact_seeds(tmp)
        npz_seeds(tmp)
        text_seeds()
    for target in sorted(counts):
        folder = os.path.join(CACHE, target, "seeds")
        print(f"make_seeds: {target}: {len(os.listdir(folder))} seeds in {folder}")


if __name__ == "__main__":
    main()
