"""src/ folders form layers: a file includes only headers of its own folder or of folders below it
(docs/DESIGN.md, "Layers"). An include that runs up a layer is a cycle in the making."""
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SRC = os.path.join(ROOT, "src")

# Folder -> layer; a folder may include folders of a lower layer (and itself). Folders on one
# layer are independent of each other.
LAYERS = {
    "core": 0,
    "backends": 1, "optim": 1, "data": 1, "distributed": 1,
    "ir": 2,
    "onnx": 3,
    "ops": 4,
    "passes": 5,
    "autodiff": 6,
    "runtime": 7,
    "training": 8,
    "capi": 9,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"', re.M)


def source_files():
    for dirpath, _, files in os.walk(SRC):
        for f in files:
            if f.endswith((".h", ".cc")):
                yield os.path.join(dirpath, f)


def test_every_src_folder_has_a_layer():
    folders = {d for d in os.listdir(SRC) if os.path.isdir(os.path.join(SRC, d))}
    assert folders <= set(LAYERS), f"folders without a layer (add them to LAYERS and DESIGN.md): {folders - set(LAYERS)}"


def test_includes_only_run_down():
    upward = []
    for path in source_files():
        rel = os.path.relpath(path, SRC).split(os.sep)
        folder = rel[0]
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for target, header in INCLUDE.findall(text):
            if target == "onnxtrain" or target == folder:
                continue
            if target not in LAYERS:
                upward.append(f"{'/'.join(rel)} includes {target}/{header}: unknown folder")
            elif LAYERS[target] >= LAYERS[folder]:
                upward.append(f"{'/'.join(rel)} (layer {LAYERS[folder]}) includes {target}/{header} (layer {LAYERS[target]})")
    assert not upward, "includes that run up a layer:\n  " + "\n  ".join(upward)


def test_op_machinery_does_not_include_op_families():
    # src/ops/*.{h,cc} is what every op file builds on; it must not depend on any op family.
    ops = os.path.join(SRC, "ops")
    bad = []
    for f in os.listdir(ops):
        path = os.path.join(ops, f)
        if os.path.isfile(path) and f.endswith((".h", ".cc")):
            with open(path, encoding="utf-8") as fh:
                for target, header in INCLUDE.findall(fh.read()):
                    if target == "ops" and "/" in header:
                        bad.append(f"ops/{f} includes ops/{header}")
    assert not bad, "\n".join(bad)


# The Python package's front ends sit on top: onnxtrain.hf (Hugging Face Trainer and PEFT) builds on
# onnxtrain.torch and onnxtrain.api, and nothing else in the package imports it (it needs transformers).
PACKAGE = os.path.join(ROOT, "python", "onnxtrain")
HF_IMPORT = re.compile(r"^\s*(from\s+(onnxtrain\.hf|\.+hf)\b|import\s+onnxtrain\.hf\b)", re.M)


def test_nothing_below_the_hf_front_end_imports_it():
    bad = []
    for dirpath, _, files in os.walk(PACKAGE):
        rel = os.path.relpath(dirpath, PACKAGE).split(os.sep)
        if rel[0] == "hf":
            continue
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                    if HF_IMPORT.search(fh.read()):
                        bad.append(os.path.join(*rel, f))
    assert os.path.isdir(os.path.join(PACKAGE, "hf")), "python/onnxtrain/hf is gone: update this test and DESIGN.md"
    assert not bad, f"modules below the hf front end import it: {bad}"
