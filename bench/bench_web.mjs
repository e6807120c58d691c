// The WebAssembly module's size and speed (make bench-web): .wasm bytes for the digits and the
// BERT-style op sets, and train steps (train step + optimizer step, inputs zero-filled) in Node
// against the native minimal build compiled for the baseline ISA (x86-64: SSE2) and for
// -march=native (bench/startup.cc), and the threaded module on 2 threads against its single thread
// (and the baseline native build on 2 threads against 1, for reference).
//
//   node bench/bench_web.mjs [--rounds N] [--steps N]
//
// Each configuration runs in its own process; the rounds interleave them (the machine is shared),
// and each figure is the median over rounds of a run's median step. Reported: wall milliseconds,
// and CPU milliseconds per step (a run's time on a core): the process's for WebAssembly (for the
// threaded module, all threads together), the main thread's for native. Needs make web, make minimal, make minimal-baseline for both op sets and
// web/tests/make_fixtures.py --bert (the bench-web target does all of it).
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, statSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : fallback;
};
const fixtures = path.join(root, "build-web", "fixtures");
const MODELS = {
  digits: { artifacts: path.join(fixtures, "digits_artifacts"), web: "build-web", baseline: "build-minimal-baseline",
            native: "build-minimal", inputs: { input: [[64, 1, 8, 8], "float32"], target: [[64], "int64"] } },
  bert: { artifacts: path.join(fixtures, "bert_artifacts"), web: "build-web-bert", baseline: "build-minimal-baseline-bert",
          native: "build-minimal", inputs: { x: [[8, 128], "int64"], target: [[8], "int64"] } },
};

// ---- a child: one configuration, prints {"wall": ms, "cpu": ms}
async function child(model, threads, steps) {
  const { TrainingSession, Tensor, env } = await import("../web/onnxtrain.mjs");
  const spec = MODELS[model];
  env.wasm.wasmPaths = path.join(root, spec.web, "web") + "/";
  env.wasm.numThreads = threads;
  const a = spec.artifacts;
  const session = await TrainingSession.create({ checkpointState: `${a}/checkpoint`, trainModel: `${a}/training_model.onnx`,
                                                 evalModel: `${a}/eval_model.onnx`, optimizerModel: `${a}/optimizer_model.onnx` });
  if (session.numThreads !== threads) throw new Error(`asked for ${threads} threads, the module runs ${session.numThreads}`);
  const feeds = {};
  for (const [name, [dims, type]] of Object.entries(spec.inputs)) {
    const n = dims.reduce((x, y) => x * y, 1);
    feeds[name] = new Tensor(type, type === "int64" ? new BigInt64Array(n) : new Float32Array(n), dims);
  }
  const walls = [], cpus = [];
  for (let i = 0; i < steps + 2; ++i) {  // 2 warm-up steps: plans, first touches
    const t0 = performance.now(), c0 = process.cpuUsage();
    await session.runTrainStep(feeds);
    await session.runOptimizerStep();
    await session.lazyResetGrad();
    const c = process.cpuUsage(c0);
    if (i >= 2) {
      walls.push(performance.now() - t0);
      cpus.push((c.user + c.system) / 1000);
    }
  }
  await session.release();
  console.log(JSON.stringify({ wall: median(walls), cpu: median(cpus) }));
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

function runWasm(model, threads, steps) {
  const out = execFileSync(process.execPath, [fileURLToPath(import.meta.url), "--child", model, String(threads), String(steps)],
                           { encoding: "utf8" });
  return JSON.parse(out.trim().split("\n").pop());
}

function runNative(model, build, steps, threads = 1) {
  const spec = MODELS[model];
  const shapes = Object.entries(spec.inputs).map(([name, [dims, type]]) => `${name}=${dims.join(",")}${type === "int64" ? ":i64" : ""}`);
  const out = execFileSync(path.join(root, build, "bench", "startup"), ["--steady-steps", String(steps), spec.artifacts, ...shapes],
                           { encoding: "utf8", env: { ...process.env, OMP_NUM_THREADS: String(threads) } });
  const fields = Object.fromEntries(out.trim().split(/\s+/).reduce((pairs, word, i, words) => (i % 2 ? pairs : [...pairs, [word, Number(words[i + 1])]]), []));
  return { wall: fields.steady_step, cpu: fields.steady_step_cpu };
}

const threaded = (model) => existsSync(path.join(root, MODELS[model].web, "web", "onnxtrain_web_threaded.wasm"));

function sizeOf(build, name) {
  const file = path.join(root, build, "web", `${name}.wasm`);
  return existsSync(file) ? statSync(file).size : "not built";
}

async function main() {
  const rounds = Number(arg("--rounds", 5)), steps = Number(arg("--steps", 20));
  console.log("WebAssembly module size (bytes of .wasm):");
  for (const [model, spec] of Object.entries(MODELS)) {
    console.log(`  ${model} op set: single-threaded ${sizeOf(spec.web, "onnxtrain_web")}, threaded ${sizeOf(spec.web, "onnxtrain_web_threaded")}`);
  }
  const configs = [];
  const models = Object.keys(MODELS).filter((model) => {
    const spec = MODELS[model];
    const missing = [path.join(spec.baseline, "bench", "startup"), path.join(spec.native, "bench", "startup"),
                     path.join(spec.web, "web", "onnxtrain_web.wasm"), path.join(spec.artifacts, "checkpoint")]
      .filter((f) => !existsSync(path.resolve(root, f)));
    if (missing.length) console.log(`  ${model}: steps not measured, missing ${missing.join(", ")}`);
    return missing.length === 0;
  });
  for (const model of models) {
    configs.push([model, "native -march=native", () => runNative(model, MODELS[model].native, steps)]);
    configs.push([model, "native baseline x86-64", () => runNative(model, MODELS[model].baseline, steps)]);
    configs.push([model, "wasm 1 thread", () => runWasm(model, 1, steps)]);
    if (threaded(model)) {
      configs.push([model, "native baseline 2 threads", () => runNative(model, MODELS[model].baseline, steps, 2)]);
      configs.push([model, "wasm 2 threads", () => runWasm(model, 2, steps)]);
    }
  }
  const results = new Map(configs.map(([m, c]) => [`${m}|${c}`, []]));
  for (let r = 0; r < rounds; ++r) {
    for (const [model, config, run] of configs) results.get(`${model}|${config}`).push(run());
  }
  const load = readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");
  const figure = (model, config, key = "wall") => median(results.get(`${model}|${config}`).map((x) => x[key]));
  console.log(`\nTrain step + optimizer step, median over ${rounds} interleaved rounds of each run's median of ${steps} steps (ms; load after: ${load}):`);
  for (const [model, config] of configs) {
    console.log(`  ${model.padEnd(6)} ${config.padEnd(26)} wall ${figure(model, config).toFixed(2).padStart(8)}  cpu ${figure(model, config, "cpu").toFixed(2).padStart(8)}`);
  }
  console.log("\nRatios (wall; cpu):");
  for (const model of models) {
    for (const base of ["native baseline x86-64", "native -march=native"]) {
      const w = figure(model, "wasm 1 thread") / figure(model, base);
      const c = figure(model, "wasm 1 thread", "cpu") / figure(model, base, "cpu");
      console.log(`  ${model}: wasm 1 thread / ${base}: ${w.toFixed(2)}x; ${c.toFixed(2)}x`);
    }
  }
  for (const model of models) {
    if (!threaded(model)) {
      console.log(`  ${model}: threaded module not built (make web WEB_THREADED=ON)`);
      continue;
    }
    // Speed-up of 2 threads over 1: wall time; CPU time per step tells how much the second thread added.
    const speedup = (one, two) => figure(model, one) / figure(model, two);
    const cpu = (one, two) => figure(model, two, "cpu") / figure(model, one, "cpu");
    console.log(`  ${model}: wasm 2 threads over 1: speed-up ${speedup("wasm 1 thread", "wasm 2 threads").toFixed(2)}x, ` +
                `${cpu("wasm 1 thread", "wasm 2 threads").toFixed(2)}x the CPU time`);
    // (startup.cc's CPU time is its main thread's: no total to compare.)
    console.log(`  ${model}: native baseline 2 threads over 1: speed-up ${speedup("native baseline x86-64", "native baseline 2 threads").toFixed(2)}x`);
  }
}

if (process.argv[2] === "--child") await child(process.argv[3], Number(process.argv[4]), Number(process.argv[5]));
else await main();
