// Shared by the WebAssembly module's tests: where the module, the digits fixtures
// (web/tests/make_fixtures.py) and the native reference (web_native_steps) are, and the batches.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const webBuild = path.resolve(root, process.env.ONNXTRAIN_WEB_DIR ?? "build-web");
export const wasmPaths = path.join(webBuild, "web") + "/";
export const fixtures = path.resolve(root, process.env.ONNXTRAIN_WEB_FIXTURES ?? path.join(webBuild, "fixtures"));
export const artifacts = path.join(fixtures, "digits_artifacts");
// The native minimal build for the baseline ISA: 4-lane vectors like SIMD128 (make minimal-baseline).
export const nativeSteps = path.resolve(root, process.env.ONNXTRAIN_WEB_NATIVE ?? "build-minimal-baseline/web/web_native_steps");

export function artifactFiles() {
  return {
    checkpointState: path.join(artifacts, "checkpoint"),
    trainModel: path.join(artifacts, "training_model.onnx"),
    evalModel: path.join(artifacts, "eval_model.onnx"),
    optimizerModel: path.join(artifacts, "optimizer_model.onnx"),
  };
}

function raw(name, Type) {
  const bytes = readFileSync(path.join(fixtures, "digits_raw", name));
  return new Type(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

export const digits = {
  xTrain: raw("x_train.f32", Float32Array), yTrain: raw("y_train.i64", BigInt64Array),
  xTest: raw("x_test.f32", Float32Array), yTest: raw("y_test.i64", BigInt64Array),
};

// Batch i as web_native_steps takes it: rows [(i mod floor(N / size)) * size, + size).
export function batch(Tensor, i, size) {
  const n = digits.yTrain.length;
  const start = (i % Math.floor(n / size)) * size;
  return {
    input: new Tensor("float32", digits.xTrain.slice(start * 64, (start + size) * 64), [size, 1, 8, 8]),
    target: new Tensor("int64", digits.yTrain.slice(start, start + size), [size]),
  };
}

// The native build's losses of `steps` train steps from `checkpoint` (at learning rate `lr`, or the
// optimizer model's) on `threads` threads, its eval loss and first logits.
export function nativeRun(checkpoint, steps, size, lr, threads = 1) {
  const args = [artifacts, checkpoint, path.join(fixtures, "digits_raw"), String(steps), String(size)];
  if (lr !== undefined) args.push(String(lr));
  const env = { ...process.env, ONNXTRAIN_WEB_NATIVE_THREADS: String(threads) };
  const out = execFileSync(nativeSteps, args, { encoding: "utf8", env });
  return JSON.parse(out);
}

// The session's losses over `steps` train steps (each with an optimizer step), then its eval on batch 0.
export async function wasmRun(Tensor, session, steps, size, first = 0) {
  const losses = [];
  for (let i = first; i < first + steps; ++i) {
    const out = await session.runTrainStep(batch(Tensor, i, size));
    losses.push(out.loss.data[0]);
    await session.runOptimizerStep();
    await session.lazyResetGrad();
  }
  const evalOut = await session.runEvalStep(batch(Tensor, 0, size));
  return { losses, eval_loss: evalOut.loss.data[0], logits0: Array.from(evalOut.logits.data.slice(0, 10)) };
}

export function assertClose(assert, actual, expected, tolerance, what) {
  assert.equal(actual.length, expected.length, `${what}: ${actual.length} values, expected ${expected.length}`);
  let worst = 0, at = -1;
  for (let i = 0; i < actual.length; ++i) {
    const d = Math.abs(actual[i] - expected[i]);
    if (!(d <= worst)) { worst = d; at = i; }
  }
  assert.ok(worst <= tolerance, `${what}: |difference| ${worst} at ${at} (${actual[at]} vs ${expected[at]}) above ${tolerance}`);
  return worst;
}
