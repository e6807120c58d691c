// The WebAssembly module trains the digits CNN as the native minimal build does: 50 train steps give
// the native loss curve within 1e-5, and the checkpoint it saves loads natively with the same
// parameters (the eval loss and logits agree, and training resumed natively continues the curve).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

import { TrainingSession, Tensor, env } from "../onnxtrain.mjs";
import { artifactFiles, artifacts, assertClose, nativeRun, wasmRun, wasmPaths } from "./fixtures.mjs";

env.wasm.wasmPaths = wasmPaths;
// ONNXTRAIN_WEB_THREADS > 1: the threaded module, compared with the native build on as many threads
// (both split every parallel loop into the same static blocks, so they sum alike).
env.wasm.numThreads = Number(process.env.ONNXTRAIN_WEB_THREADS ?? 1);
const THREADS = env.wasm.numThreads;
// At AdamW's lr 3e-3 (the artifacts') the digits run is too sensitive to compare builds step by step:
// rounding differences of 1e-7 (another summation order) flip a max-pooling choice within a few
// dozen steps, and even the native build for the baseline ISA and the -march=native one then part by
// 6e-5 at step 30 (2026-11-27). At 2e-4 the loss still falls from 2.35 to 0.61, but the dropout masks
// (the checkpoint's random seed) decide whether a near-tie flips within 50 steps: over seeds 0-8,
// five kept WebAssembly and the baseline build within 2.4e-7 and four parted by 1e-5 to 3e-5 after
// step 32 (2026-11-28). make_fixtures.py fixes the seed at 0 (2.35e-7), so every checkout compares
// the same curve; a wrong kernel misses by far more than 1e-5 from the first step.
const STEPS = 50, BATCH = 64, TOLERANCE = 1e-5, LR = 2e-4;

test(`${STEPS} digits steps in WebAssembly (${env.wasm.numThreads} thread(s)) follow the native loss curve`, async () => {
  const session = await TrainingSession.create(artifactFiles());
  assert.equal(session.numThreads, env.wasm.numThreads);
  await session.setLearningRate(LR);
  const wasm = await wasmRun(Tensor, session, STEPS, BATCH);
  const native = nativeRun(path.join(artifacts, "checkpoint"), STEPS, BATCH, LR, THREADS);
  assert.ok(native.losses[0] > 2 && native.losses[STEPS - 1] < 1, `the run trains: ${native.losses[0]} -> ${native.losses[STEPS - 1]}`);
  if (THREADS > 1) {
    // The team starts its workers at its first region of more than one thread: the steps ran some.
    const started = session._api.m.PThread.runningWorkers.length;
    assert.equal(started, THREADS - 1, `kernel threads started besides the caller: ${started}`);
  }
  const worst = assertClose(assert, wasm.losses, native.losses, TOLERANCE, "train losses");
  assertClose(assert, [wasm.eval_loss], [native.eval_loss], TOLERANCE, "eval loss");
  // The logits after 50 steps carry each build's fp32 summation order (SIMD128 against SSE2 lanes,
  // OpenMP's split): a fresh checkout measured 1.4e-4 on a logit of 0.63 while the losses agreed
  // within 1e-5; 5e-4 still catches a wrong kernel (those miss by whole units).
  assertClose(assert, wasm.logits0, native.logits0, 5e-4, "eval logits");
  console.log(`# ${STEPS} steps: max |wasm - native| = ${worst.toExponential(2)}; loss ${wasm.losses[0].toFixed(4)} -> ${wasm.losses[STEPS - 1].toFixed(4)}`);

  // The checkpoint as bytes, loaded by the native build: same eval, and 5 more steps resume alike.
  const dir = mkdtempSync(path.join(tmpdir(), "onnxtrain-web-"));
  try {
    const saved = path.join(dir, "checkpoint");
    writeFileSync(saved, await session.saveCheckpoint());
    const resumedNative = nativeRun(saved, 5, BATCH, LR, THREADS);
    const resumedWasm = await wasmRun(Tensor, session, 5, BATCH);
    assertClose(assert, resumedWasm.losses, resumedNative.losses, TOLERANCE, "losses resumed natively from the saved checkpoint");
    // The same checkpoint in a new WebAssembly session: its eval equals the first session's.
    const again = await TrainingSession.create({ ...artifactFiles(), checkpointState: saved });
    const evalAgain = await again.runEvalStep((await import("./fixtures.mjs")).batch(Tensor, 0, BATCH));
    const nativeEval = nativeRun(saved, 0, BATCH, undefined, THREADS);
    assertClose(assert, [evalAgain.loss.data[0]], [nativeEval.eval_loss], TOLERANCE, "eval loss of the saved checkpoint");
    await again.release();
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await session.release();
  }
});
