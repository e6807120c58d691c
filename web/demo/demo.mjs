// The demo page (make web-demo): trains the digits CNN with web/onnxtrain.mjs, draws the loss and the
// held-out accuracy as it goes, and offers the trained checkpoint and the exported inference model
// as downloads. ?epochs=N&auto=1 starts N epochs at once (the browser test does); ?threads=N asks for
// N threads (default 0: the machine's cores, at most 4; the threaded module needs a cross-origin
// isolated page, which web/demo/serve.py serves, and one thread is used otherwise). The state is in
// window.onnxtrainDemo for tests.
import { TrainingSession, Tensor, env } from "../onnxtrain.mjs";

env.wasm.wasmPaths = new URL("../wasm/", import.meta.url).href;
const params = new URLSearchParams(location.search);
env.wasm.numThreads = Number(params.get("threads") ?? 0);
const EPOCHS = Number(params.get("epochs") ?? 12), BATCH = 64, LR = 3e-3;
const $ = (id) => document.getElementById(id);
const demo = (window.onnxtrainDemo = { state: "idle", losses: [], accuracies: [], threads: 0, stepsPerSecond: 0 });

async function fetchArray(name, Type) {
  const response = await fetch(new URL(`../data/digits_raw/${name}`, import.meta.url));
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
  return new Type(await response.arrayBuffer());
}

function draw() {
  const canvas = $("chart"), g = canvas.getContext("2d"), w = canvas.width, h = canvas.height, pad = 60;
  g.fillStyle = "#fff";
  g.fillRect(0, 0, w, h);
  g.strokeStyle = "#999";
  g.lineWidth = 2;
  g.strokeRect(pad, 20, w - 2 * pad, h - 80);
  g.font = "26px system-ui";
  g.fillStyle = "#333";
  g.fillText("loss (blue, left axis 0-2.5) and held-out accuracy (orange, right axis 0-100%) by step", pad, h - 20);
  const total = Math.max(1, demo.totalSteps ?? demo.losses.length);
  const x = (step) => pad + (w - 2 * pad) * step / total;
  const plot = (points, color, y) => {
    g.strokeStyle = color;
    g.lineWidth = 3;
    g.beginPath();
    points.forEach(([step, v], i) => (i ? g.lineTo(x(step), y(v)) : g.moveTo(x(step), y(v))));
    g.stroke();
  };
  const lossY = (v) => 20 + (h - 80) * (1 - Math.min(v, 2.5) / 2.5);
  const smoothed = [];
  let avg = null;
  demo.losses.forEach((v, i) => { avg = avg === null ? v : 0.9 * avg + 0.1 * v; smoothed.push([i + 1, avg]); });
  plot(smoothed, "#1f77b4", lossY);
  plot(demo.accuracies.map(([step, a]) => [step, a]), "#ff7f0e", (a) => 20 + (h - 80) * (1 - a));
}

async function evaluate(session, xTest, yTest) {
  const n = yTest.length;
  const out = await session.runEvalStep({ input: new Tensor("float32", xTest, [n, 1, 8, 8]), target: new Tensor("int64", yTest, [n]) });
  const logits = out.logits.data;
  let right = 0;
  for (let i = 0; i < n; ++i) {
    let best = 0;
    for (let k = 1; k < 10; ++k) if (logits[i * 10 + k] > logits[i * 10 + best]) best = k;
    if (BigInt(best) === yTest[i]) ++right;
  }
  return { accuracy: right / n, logits };
}

function download(bytes, name) {
  const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
  const a = Object.assign(document.createElement("a"), { href: url, download: name });
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function train() {
  $("train").disabled = true;
  demo.state = "loading";
  $("status").textContent = "Loading the WebAssembly module, the artifacts and the digits...";
  const art = new URL("../data/digits_artifacts/", import.meta.url);
  const session = await TrainingSession.create({
    checkpointState: new URL("checkpoint", art).href, trainModel: new URL("training_model.onnx", art).href,
    evalModel: new URL("eval_model.onnx", art).href, optimizerModel: new URL("optimizer_model.onnx", art).href });
  const [xTrain, yTrain, xTest, yTest] = await Promise.all([
    fetchArray("x_train.f32", Float32Array), fetchArray("y_train.i64", BigInt64Array),
    fetchArray("x_test.f32", Float32Array), fetchArray("y_test.i64", BigInt64Array)]);
  demo.session = session;
  demo.threads = session.numThreads;
  $("threads").textContent = `${session.numThreads}${crossOriginIsolated ? "" : " (page not cross-origin isolated)"}`;
  const n = yTrain.length, stepsPerEpoch = Math.ceil(n / BATCH);
  demo.totalSteps = EPOCHS * stepsPerEpoch;
  await session.setLRScheduler({ type: "cosine", warmupSteps: stepsPerEpoch, totalSteps: demo.totalSteps, initialLr: LR });
  demo.state = "training";
  $("status").textContent = `Training ${EPOCHS} epochs of ${stepsPerEpoch} steps (batch ${BATCH})...`;
  let seed = 1;
  const random = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
  const started = performance.now();
  let step = 0;
  for (let epoch = 0; epoch < EPOCHS; ++epoch) {
    const order = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; --i) { const j = Math.floor(random() * (i + 1)); [order[i], order[j]] = [order[j], order[i]]; }
    for (let start = 0; start < n; start += BATCH) {
      const rows = order.slice(start, start + BATCH), b = rows.length;
      const x = new Float32Array(b * 64), y = new BigInt64Array(b);
      rows.forEach((r, k) => { x.set(xTrain.subarray(r * 64, r * 64 + 64), k * 64); y[k] = yTrain[r]; });
      const out = await session.runTrainStep({ input: new Tensor("float32", x, [b, 1, 8, 8]), target: new Tensor("int64", y, [b]) });
      await session.runOptimizerStep();
      await session.schedulerStep();
      await session.lazyResetGrad();
      demo.losses.push(out.loss.data[0]);
      ++step;
      if (step % 8 === 0) await new Promise(requestAnimationFrame);  // let the page draw
    }
    const { accuracy } = await evaluate(session, xTest, yTest);
    demo.accuracies.push([step, accuracy]);
    demo.accuracy = accuracy;
    demo.stepsPerSecond = step / ((performance.now() - started) / 1000);
    $("epoch").textContent = `${epoch + 1} / ${EPOCHS}`;
    $("loss").textContent = demo.losses[demo.losses.length - 1].toFixed(4);
    $("accuracy").textContent = `${(100 * accuracy).toFixed(2)}%`;
    $("rate").textContent = demo.stepsPerSecond.toFixed(1);
    draw();
    await new Promise(requestAnimationFrame);
  }
  // What the downloads hold, for the browser test to check natively: the test images' logits.
  demo.testLogits = Array.from((await evaluate(session, xTest, yTest)).logits);
  demo.state = "done";
  $("status").textContent = `Done: ${(100 * demo.accuracy).toFixed(2)}% held-out accuracy after ${step} steps.`;
  $("checkpoint").disabled = $("model").disabled = false;
}

demo.exports = async () => {
  const b64 = (bytes) => { let s = ""; for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000)); return btoa(s); };
  return { checkpoint: b64(await demo.session.saveCheckpoint()), model: b64(await demo.session.exportModelForInferencing(["logits"])),
           logits: demo.testLogits };
};

$("train").onclick = () => train().catch((e) => {
  demo.state = "error";
  demo.error = String(e?.message ?? e);
  $("status").textContent = `Error: ${demo.error}`;
  $("status").className = "error";
});
$("checkpoint").onclick = async () => download(await demo.session.saveCheckpoint(), "digits_checkpoint");
$("model").onclick = async () => download(await demo.session.exportModelForInferencing(["logits"]), "digits_inference.onnx");
draw();
if (params.get("auto") === "1") $("train").click();
