"""The Python front end of the kill test (tests/crash/kill_test.py): the same loop as
crash_train.cc, through onnxtrain.api (CheckpointState.save_checkpoint, Module, Optimizer).

    crash_train.py ARTIFACTS DATA.npz CHECKPOINT FORMAT STEPS BATCH EXPORT.onnx OUTPUT [KEEP_DIR]

FORMAT: onnxtrain or ort.
"""
import os
import sys

import numpy as np

from onnxtrain.api import CheckpointState, Module, Optimizer


def main(argv):
    art, data_path, checkpoint, fmt, steps, batch, exported, output = argv[:8]
    keep = argv[8] if len(argv) > 8 else None
    steps, batch = int(steps), int(batch)
    state = CheckpointState.load_checkpoint(checkpoint if os.path.exists(checkpoint) else os.path.join(art, "checkpoint"))
    first = state.properties["crash.step"] if "crash.step" in state.properties else 0
    module = Module(os.path.join(art, "training_model.onnx"), state, os.path.join(art, "eval_model.onnx"))
    optimizer = Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
    data = np.load(data_path)
    x, y = data["x"], data["y"]
    module.train()
    for s in range(first, steps):
        rows = (s * batch + np.arange(batch)) % len(x)
        module(x[rows], y[rows])
        optimizer.step()
        module.lazy_reset_grad()
        state.properties["crash.step"] = s + 1
        CheckpointState.save_checkpoint(state, checkpoint, include_optimizer_state=True, format=fmt)
        module.export_model_for_inferencing(exported, [output])
        if keep:
            CheckpointState.save_checkpoint(state, os.path.join(keep, f"ckpt-{s + 1}"), include_optimizer_state=True,
                                            format=fmt)
            module.export_model_for_inferencing(os.path.join(keep, f"model-{s + 1}.onnx"), [output])
    if first >= steps:  # killed between the last save and its export
        module.export_model_for_inferencing(exported, [output])


if __name__ == "__main__":
    main(sys.argv[1:])
