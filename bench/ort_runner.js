#!/usr/bin/env node
// Times one ONNX model in ONNX Runtime (npm onnxruntime-node, native CPU engine).
//
//   node ort_runner.js --model m.onnx --input NAME=file.npy [--input ...] [--threads N]
//                      [--warmup W] [--runs R] [--budget-ms B] [--gap-ms G] [--save-outputs DIR]
//
// Inputs are .npy files (little-endian float32/float64/int32/int64/bool, C order). Prints one JSON
// object on stdout: {median_ms, min_ms, mean_ms, runs, times_ms, threads, ort_version, load_ms,
// outputs: [{name, dims, type, sum, file}]}; with --save-outputs every output is written as
// DIR/<index>.npy so the caller can compare it. With --budget-ms, warmup and timed runs each stop
// once they have used that long (after at least one run each). With --gap-ms, each timed run
// follows G ms idle (requests that arrive apart: the thread pool has gone to sleep), outside the
// budget. Errors go to stderr with a nonzero exit status.
'use strict';

const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

const NPY_TYPES = {
  '<f4': { ort: 'float32', array: Float32Array },
  '<f8': { ort: 'float64', array: Float64Array },
  '<i4': { ort: 'int32', array: Int32Array },
  '<i8': { ort: 'int64', array: BigInt64Array },
  '|b1': { ort: 'bool', array: Uint8Array },
  '|u1': { ort: 'uint8', array: Uint8Array },
};

function parseArgs(argv) {
  const args = { inputs: [], threads: 1, warmup: 5, runs: 20, saveOutputs: null, model: null,
    budgetMs: Infinity, gapMs: 0 };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${flag} needs a value`);
      return argv[++i];
    };
    switch (flag) {
      case '--model': args.model = value(); break;
      case '--input': {
        const spec = value();
        const eq = spec.indexOf('=');
        if (eq <= 0) throw new Error(`--input wants NAME=file.npy, got '${spec}'`);
        args.inputs.push({ name: spec.slice(0, eq), file: spec.slice(eq + 1) });
        break;
      }
      case '--threads': args.threads = parseInt(value(), 10); break;
      case '--warmup': args.warmup = parseInt(value(), 10); break;
      case '--runs': args.runs = parseInt(value(), 10); break;
      case '--save-outputs': args.saveOutputs = value(); break;
      case '--budget-ms': args.budgetMs = parseFloat(value()); break;
      case '--gap-ms': args.gapMs = parseFloat(value()); break;
      default: throw new Error(`unknown argument '${flag}'`);
    }
  }
  if (!args.model) throw new Error('--model is required');
  if (!(args.runs >= 1)) throw new Error('--runs must be >= 1');
  return args;
}

// Reads a .npy file (format versions 1-3) into an ort.Tensor.
function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.length < 10 || buf.toString('latin1', 0, 6) !== '\x93NUMPY') {
    throw new Error(`${file}: not a .npy file`);
  }
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const headerStart = major === 1 ? 10 : 12;
  const header = buf.toString('latin1', headerStart, headerStart + headerLen);
  const descr = /'descr':\s*'([^']+)'/.exec(header);
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shape) throw new Error(`${file}: unreadable header ${header}`);
  if (fortran[1] === 'True') throw new Error(`${file}: Fortran order is not supported`);
  const type = NPY_TYPES[descr[1]];
  if (!type) throw new Error(`${file}: dtype ${descr[1]} is not supported`);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  const dataStart = headerStart + headerLen;
  const bytes = count * type.array.BYTES_PER_ELEMENT;
  if (buf.length - dataStart < bytes) throw new Error(`${file}: truncated data`);
  // Copy into a fresh, aligned buffer: the data offset in the file need not be aligned.
  const data = new type.array(count);
  new Uint8Array(data.buffer).set(buf.subarray(dataStart, dataStart + bytes));
  return new ort.Tensor(type.ort, type.ort === 'bool' ? Uint8Array.from(data) : data, dims);
}

// Writes an ort.Tensor as a version-1 .npy file.
function writeNpy(file, tensor) {
  const entry = Object.entries(NPY_TYPES).find(([, t]) => t.ort === tensor.type);
  if (!entry) throw new Error(`output type ${tensor.type} cannot be saved`);
  const shape = tensor.dims.length === 1 ? `(${tensor.dims[0]},)` : `(${tensor.dims.join(', ')})`;
  let header = `{'descr': '${entry[0]}', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat(63 - ((10 + header.length) % 64)) + '\n';  // total header multiple of 64
  const prefix = Buffer.alloc(10);
  prefix.write('\x93NUMPY', 0, 'latin1');
  prefix[6] = 1;
  prefix[7] = 0;
  prefix.writeUInt16LE(header.length, 8);
  const data = tensor.data;
  fs.writeFileSync(file, Buffer.concat([prefix, Buffer.from(header, 'latin1'),
    Buffer.from(data.buffer, data.byteOffset, data.byteLength)]));
}

function checksum(tensor) {
  let sum = 0;
  for (const v of tensor.data) sum += Number(v);
  return sum;
}

function median(values) {
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const options = {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    intraOpNumThreads: args.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
  };
  const t0 = process.hrtime.bigint();
  const session = await ort.InferenceSession.create(args.model, options);
  const loadMs = Number(process.hrtime.bigint() - t0) / 1e6;

  const feeds = {};
  for (const { name, file } of args.inputs) feeds[name] = readNpy(file);
  const missing = session.inputNames.filter((n) => !(n in feeds));
  if (missing.length) throw new Error(`no --input for model inputs: ${missing.join(', ')}`);

  const elapsedMs = (since) => Number(process.hrtime.bigint() - since) / 1e6;
  let outputs = await session.run(feeds);  // also the first warmup run
  const warmStart = process.hrtime.bigint();
  for (let i = 1; i < args.warmup && elapsedMs(warmStart) < args.budgetMs; i++) {
    outputs = await session.run(feeds);
  }
  const times = [];
  let timedMs = 0;
  for (let i = 0; i < args.runs; i++) {
    if (args.gapMs > 0) await new Promise((resolve) => setTimeout(resolve, args.gapMs));
    const start = process.hrtime.bigint();
    outputs = await session.run(feeds);
    times.push(elapsedMs(start));
    timedMs += times[times.length - 1];
    if (timedMs > args.budgetMs) break;
  }

  const report = [];
  if (args.saveOutputs) fs.mkdirSync(args.saveOutputs, { recursive: true });
  session.outputNames.forEach((name, index) => {
    const tensor = outputs[name];
    const item = { name, dims: tensor.dims, type: tensor.type, sum: checksum(tensor) };
    if (args.saveOutputs) {
      item.file = path.join(args.saveOutputs, `${index}.npy`);
      writeNpy(item.file, tensor);
    }
    report.push(item);
  });

  console.log(JSON.stringify({
    median_ms: median(times),
    min_ms: Math.min(...times),
    mean_ms: times.reduce((a, b) => a + b, 0) / times.length,
    runs: times.length,
    times_ms: times,
    threads: args.threads,
    ort_version: require('onnxruntime-node/package.json').version,
    load_ms: loadMs,
    outputs: report,
  }));
}

main().catch((err) => {
  process.stderr.write(`ort_runner: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
