// An ONNX Runtime Web training app's own files: the artifacts and checkpoint ONNX Runtime training
// 1.19.2's generate_artifacts wrote for a digits CNN (web/tests/make_fixtures.py, in the
// ort-training peer) train in the module as in ONNX Runtime itself: the losses of 5 AdamW steps on
// the same batches equal those ORT's Module gave, within 1e-5 relative (as tests/python/test_ort_artifacts.py
// holds the native build to).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";

import { TrainingSession, Tensor, env } from "../onnxtrain.mjs";
import { fixtures, wasmPaths } from "./fixtures.mjs";

env.wasm.wasmPaths = wasmPaths;
env.wasm.numThreads = Number(process.env.ONNXTRAIN_WEB_THREADS ?? 1);  // >1: the threaded module

const artifacts = path.join(fixtures, "ort_digits_artifacts");
const raw = path.join(fixtures, "ort_digits_raw");

function typed(file, Type) {
  const bytes = readFileSync(path.join(raw, file));
  return new Type(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

test("ONNX Runtime 1.19.2's artifacts and checkpoint train as in ONNX Runtime", async () => {
  const expected = JSON.parse(readFileSync(path.join(artifacts, "ort_losses.json"), "utf8"));
  const dims = expected.batch_shape;
  const session = await TrainingSession.create({
    checkpointState: path.join(artifacts, "checkpoint"),
    trainModel: path.join(artifacts, "training_model.onnx"),
    optimizerModel: path.join(artifacts, "optimizer_model.onnx"),
  });
  try {
    assert.deepEqual(session.trainingInputNames, ["input", "labels"]);
    const losses = [];
    for (let k = 0; k < expected.losses.length; ++k) {
      const out = await session.runTrainStep({
        input: new Tensor("float32", typed(`x${k}.f32`, Float32Array), dims),
        labels: new Tensor("int64", typed(`y${k}.i64`, BigInt64Array), [dims[0]]),
      });
      losses.push(out[session.trainingOutputNames[0]].data[0]);
      await session.runOptimizerStep();
      await session.lazyResetGrad();
    }
    for (let k = 0; k < losses.length; ++k) {
      const relative = Math.abs(losses[k] - expected.losses[k]) / Math.abs(expected.losses[k]);
      assert.ok(relative <= 1e-5, `step ${k}: loss ${losses[k]}, ONNX Runtime ${expected.losses[k]} (relative ${relative})`);
    }
  } finally {
    await session.release();
  }
});
