// web/onnxtrain.mjs as ONNX Runtime Web's training API: names, steps, parameters, the extras
// (checkpoint bytes, learning rate and schedulers, the inference model), and bad input, which is a
// JavaScript Error naming what was wrong while the WebAssembly instance stays usable.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { TrainingSession, Tensor, env } from "../onnxtrain.mjs";
import { artifactFiles, batch, wasmPaths } from "./fixtures.mjs";

env.wasm.wasmPaths = wasmPaths;
env.wasm.numThreads = Number(process.env.ONNXTRAIN_WEB_THREADS ?? 1);  // >1: the threaded module
const BATCH = 16;

async function session(files = artifactFiles()) {
  return TrainingSession.create(files);
}

test("ORT Web's names, steps and parameter buffers", async () => {
  const s = await session();
  assert.deepEqual(s.trainingInputNames, ["input", "target"]);
  assert.deepEqual(s.trainingOutputNames, ["loss", "logits"]);
  assert.deepEqual(s.evalInputNames, ["input", "target"]);
  assert.deepEqual(s.evalOutputNames, ["loss", "logits"]);

  const size = await s.getParametersSize();
  const all = await s.getParametersSize(false);
  assert.ok(size > 20000 && all >= size, `${size} trainable of ${all}`);
  const before = await s.getContiguousParameters();
  assert.equal(before.type, "float32");
  assert.deepEqual(before.dims, [size]);

  const out = await s.runTrainStep(batch(Tensor, 0, BATCH));
  assert.deepEqual(Object.keys(out), ["loss", "logits"]);
  assert.deepEqual(out.logits.dims, [BATCH, 10]);
  assert.ok(out.loss.data[0] > 1.5 && out.loss.data[0] < 4, `first loss ${out.loss.data[0]}`);
  const onlyLoss = await s.runEvalStep(batch(Tensor, 0, BATCH), ["loss"]);
  assert.deepEqual(Object.keys(onlyLoss), ["loss"]);
  await s.runOptimizerStep();
  await s.lazyResetGrad();
  const after = await s.getContiguousParameters();
  const moved = after.data.filter((v, i) => v !== before.data[i]).length;
  assert.ok(moved > size / 2, `the optimizer step moved ${moved} of ${size} parameters`);

  // loadParametersBuffer of all parameters (BatchNorm's running statistics too) puts the first ones
  // back: the eval loss returns to a fresh session's.
  const fresh = await session();
  const first = await fresh.getContiguousParameters(false);
  const evalFirst = (await fresh.runEvalStep(batch(Tensor, 1, BATCH))).loss.data[0];
  assert.notEqual((await s.runEvalStep(batch(Tensor, 1, BATCH))).loss.data[0], evalFirst);
  await s.loadParametersBuffer(new Uint8Array(first.data.buffer), false);
  assert.deepEqual(Array.from((await s.getContiguousParameters()).data), Array.from(before.data));
  assert.equal((await s.runEvalStep(batch(Tensor, 1, BATCH))).loss.data[0], evalFirst);
  await fresh.release();
  await s.release();
});

test("beyond ORT Web: checkpoint bytes, learning rate and schedulers, the inference model", async () => {
  const s = await session();
  assert.ok(Math.abs((await s.getLearningRate()) - 3e-3) < 1e-9, "the optimizer model's learning rate (a float32 attribute)");
  await s.setLearningRate(1e-4);
  assert.equal(await s.getLearningRate(), 1e-4);
  await s.setLRScheduler({ type: "linear", warmupSteps: 4, totalSteps: 12, initialLr: 2e-3 });
  assert.equal(await s.getLearningRate(), 0, "linear warmup starts at 0");
  for (let i = 0; i < 2; ++i) {
    await s.runTrainStep(batch(Tensor, i, BATCH));
    await s.runOptimizerStep();
    await s.lazyResetGrad();
    assert.ok(Math.abs((await s.schedulerStep()) - 2e-3 * (i + 1) / 4) < 1e-12);
  }
  assert.equal(await s.getStepCount(), 2);
  await s.setLRScheduler({ type: "step", stepSize: 1, gamma: 0.5, initialLr: 1e-3 });
  assert.ok(Math.abs((await s.getLearningRate()) - 1e-3 * 0.25) < 1e-15, "StepLR at step 2");
  await s.setLRScheduler({ type: "cosine", warmupSteps: 0, totalSteps: 4, initialLr: 1e-3 });
  assert.ok(Math.abs((await s.getLearningRate()) - 0.5e-3) < 1e-12, "half way down the cosine");
  await s.setLRScheduler({ type: "constant", warmupSteps: 0, initialLr: 7e-4 });
  assert.equal(await s.getLearningRate(), 7e-4);

  // The checkpoint as bytes starts a new session at the same point (parameters and optimizer state).
  const bytes = await s.saveCheckpoint();
  const head = new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true);
  assert.ok(head > 0n && head < BigInt(bytes.length), "a safetensors header length");
  const resumed = await session({ ...artifactFiles(), checkpointState: bytes });
  assert.deepEqual(Array.from((await resumed.getContiguousParameters()).data), Array.from((await s.getContiguousParameters()).data));
  assert.equal(await resumed.getStepCount(), 2);
  const withoutOptimizer = await s.saveCheckpoint({ includeOptimizerState: false });
  assert.ok(withoutOptimizer.length < bytes.length / 2, `${withoutOptimizer.length} vs ${bytes.length} bytes`);

  // The exported inference model: ONNX bytes whose initializers carry the trained parameters.
  const model = await s.exportModelForInferencing(["logits"]);
  assert.equal(model[0], 0x08, "an ONNX ModelProto starts with its ir_version field");
  assert.ok(model.length > 4 * (await s.getParametersSize()), `${model.length} bytes`);
  const evalModel = readFileSync(artifactFiles().evalModel);
  assert.notDeepEqual(model, new Uint8Array(evalModel));
  await assert.rejects(s.exportModelForInferencing(["nope"]), (e) => e instanceof Error && /nope/.test(e.message));
  await resumed.release();
  await s.release();
});

test("bad input is an Error naming the problem, and the instance stays usable", async () => {
  const files = artifactFiles();
  const good = Object.fromEntries(Object.entries(files).map(([k, p]) => [k, new Uint8Array(readFileSync(p))]));
  const isError = (pattern) => (e) => {
    assert.ok(e instanceof Error, `an Error, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  };
  // Corrupt model and checkpoint bytes.
  await assert.rejects(TrainingSession.create({ ...good, trainModel: good.trainModel.slice(0, good.trainModel.length / 2) }),
                       isError(/trainModel.*(truncated|end of|past the end|length)/i));
  const flipped = good.checkpointState.slice();
  flipped[flipped.length - 100] ^= 0xff;
  await assert.rejects(TrainingSession.create({ ...good, checkpointState: flipped }), isError(/checkpointState.*(checksum|CRC)/i));
  await assert.rejects(TrainingSession.create({ ...good, checkpointState: new Uint8Array([1, 2, 3]) }), isError(/checkpointState/));
  await assert.rejects(TrainingSession.create({ ...good, optimizerModel: good.evalModel }), isError(/optimizerModel/));
  await assert.rejects(TrainingSession.create({ trainModel: good.trainModel }), TypeError);

  const s = await TrainingSession.create(good);
  const feeds = batch(Tensor, 0, BATCH);
  // Wrong names, dims, dtypes, data sizes.
  await assert.rejects(s.runTrainStep({ ...feeds, labels: feeds.target }), isError(/'labels' is not an input/));
  await assert.rejects(s.runTrainStep({ input: feeds.input }), isError(/input 'target' is missing/));
  await assert.rejects(s.runTrainStep({ ...feeds, input: new Tensor("float32", feeds.input.data, [BATCH, 64]) }),
                       isError(/input 'input'.*rank 4/));
  await assert.rejects(s.runTrainStep({ ...feeds, target: new Tensor("int32", Int32Array.from(feeds.target.data, Number), [BATCH]) }),
                       isError(/target.*int64.*int32|int32.*int64/i));
  await assert.rejects(s.runTrainStep({ ...feeds, target: new Tensor("int64", feeds.target.data.slice(0, 4), [4]) }),
                       isError(/labels of shape \[4\] do not match/));
  assert.throws(() => new Tensor("float32", new Float32Array(3), [2, 2]), RangeError);
  assert.throws(() => new Tensor("int64", new Int32Array(4), [4]), TypeError);
  // A Tensor's fields changed after construction: the run checks them again, never reading past the data.
  const shrunk = new Tensor("float32", feeds.input.data.slice(), feeds.input.dims);
  shrunk.data = shrunk.data.subarray(0, 4);
  await assert.rejects(s.runTrainStep({ ...feeds, input: shrunk }), isError(/input 'input'.*dims \[.*\] hold \d+ elements, the data has 4/));
  const regrown = new Tensor("float32", feeds.input.data.slice(), feeds.input.dims);
  regrown.dims = [2 * BATCH, ...feeds.input.dims.slice(1)];
  await assert.rejects(s.runTrainStep({ ...feeds, input: regrown }), isError(/input 'input'.*hold \d+ elements/));
  await assert.rejects(s.runTrainStep({ ...feeds, target: new Tensor("int64", feeds.target.data.map(() => 10n), [BATCH]) }),
                       isError(/10/));
  await assert.rejects(s.loadParametersBuffer(new Uint8Array(12)), isError(/3|12/));
  await assert.rejects(s.setLRScheduler({ type: "exponential" }), TypeError);

  // The same session, and the module, still work: a correct step gives the first loss of a fresh session.
  const fresh = await TrainingSession.create(good);
  const expected = (await fresh.runTrainStep(feeds)).loss.data[0];
  assert.equal((await s.runTrainStep(feeds)).loss.data[0], expected);
  await s.runOptimizerStep();

  // Calls after release().
  await s.release();
  await s.release();  // twice is harmless
  for (const call of [() => s.runTrainStep(feeds), () => s.runOptimizerStep(), () => s.runEvalStep(feeds),
                      () => s.lazyResetGrad(), () => s.getContiguousParameters(), () => s.saveCheckpoint()]) {
    await assert.rejects(call(), isError(/was released/));
  }
  assert.equal((await fresh.runEvalStep(feeds)).loss.data.length, 1);
  await fresh.release();
});

test("pre-compiled artifacts: compiled in WebAssembly, loaded by create(), the same steps", async () => {
  const files = artifactFiles();
  const compiled = await TrainingSession.compileArtifacts(files, { input: [BATCH, 1, 8, 8], target: [BATCH] });
  assert.deepEqual(Object.keys(compiled).sort(), ["evalModel", "optimizerModel", "trainModel"]);
  const plain = await session(files);
  const fromCompiled = await TrainingSession.create({ ...files, compiled });
  for (let i = 0; i < 3; ++i) {
    const a = await plain.runTrainStep(batch(Tensor, i, BATCH));
    const b = await fromCompiled.runTrainStep(batch(Tensor, i, BATCH));
    assert.equal(b.loss.data[0], a.loss.data[0]);
    for (const s of [plain, fromCompiled]) {
      await s.runOptimizerStep();
      await s.lazyResetGrad();
    }
  }
  // A damaged pre-compiled file is ignored (the ONNX file is loaded instead): same first loss.
  const damaged = compiled.trainModel.slice();
  damaged[damaged.length >> 1] ^= 0xff;
  const fallback = await TrainingSession.create({ ...files, compiled: { trainModel: damaged } });
  assert.equal((await fallback.runTrainStep(batch(Tensor, 0, BATCH))).loss.data[0],
               (await (await session(files)).runTrainStep(batch(Tensor, 0, BATCH))).loss.data[0]);
  for (const s of [plain, fromCompiled, fallback]) await s.release();
});
