"""docs/MIGRATING_FROM_ORT.md's switch example runs as written: the ORT training script (its
`before` import) under ONNX Runtime training 1.19.2 (the `ort-training` peer), the same script with
the `after` import under onnxtrain, each on its own copy of ORT-generated artifacts and the same
batches; the checkpoints they save hold the same parameters (1e-5 of each tensor's largest value)."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

import onnxtrain
import peers
from onnxtrain.api import CheckpointState

import ort_zoo  # bench/ort_zoo.py

GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "MIGRATING_FROM_ORT.md")


def _example():
    text = open(GUIDE, encoding="utf-8").read()
    block = re.search(r"<!-- switch-example -->\n```python\n(.*?)```", text, re.S)
    assert block, "MIGRATING_FROM_ORT.md lost its switch example"
    return block.group(1).splitlines()


def _script(lines, keep):
    """The example with only the import marked `keep` ("before" or "after"), batches from batches.npz."""
    drop = "# after" if keep == "before" else "# before"
    body = "\n".join(line for line in lines if drop not in line)
    return ("import numpy as np\n_data = np.load('batches.npz')\n"
            "batches = [(_data[f'x{k}'], _data[f'y{k}']) for k in range(len(_data.files) // 2)]\n" + body + "\n")


def test_the_switch_example_trains_as_ort_does(tmp_path, ort_training_peer):
    lines = _example()
    assert sum("import CheckpointState, Module, Optimizer" in line for line in lines) == 2
    path, params = ort_zoo.export("mlp", tmp_path)
    batches = ort_zoo.batches("mlp", 5)
    data = str(tmp_path / "batches.npz")
    np.savez(data, **{f"x{k}": x for k, (x, _) in enumerate(batches)}, **{f"y{k}": y for k, (_, y) in enumerate(batches)})
    generated = str(tmp_path / "generated")
    proc = peers.run("ort-training", ["-c", ort_zoo.ORT_SCRIPT, path, json.dumps(params), data, generated, "adamw", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = {}
    for keep, python in (("before", peers.python("ort-training")), ("after", sys.executable)):
        work = tmp_path / keep
        shutil.copytree(generated, work / "artifacts")
        shutil.copy(data, work / "batches.npz")
        run = subprocess.run([python, "-c", _script(lines, keep)], cwd=work, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(onnxtrain.__file__))},
                             timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        saved[keep] = CheckpointState.load_checkpoint(str(work / "artifacts" / "checkpoint"))
    with open(tmp_path / "after" / "artifacts" / "checkpoint", "rb") as f:
        assert f.read(8)[4:] != b"ODTC"  # onnxtrain's own format unless format="ort"
    start = CheckpointState.load_checkpoint(os.path.join(generated, "checkpoint"))
    for name in params:
        ours, theirs = (np.asarray(saved[k].parameters[name].data) for k in ("after", "before"))
        assert np.max(np.abs(ours - theirs)) <= 1e-5 * np.max(np.abs(theirs)), name
        assert not np.array_equal(theirs, np.asarray(start.parameters[name].data)), f"{name}: ORT did not train"
