// onnxtrain in WebAssembly: on-device training in a browser or Node, with ONNX Runtime Web's
// training API (onnxruntime-web/training 1.19), so an ORT Web training app switches by its import:
//
//   import { TrainingSession, Tensor, env } from "./onnxtrain.mjs";
//   const session = await TrainingSession.create({ checkpointState: "checkpoint",
//     trainModel: "training_model.onnx", evalModel: "eval_model.onnx", optimizerModel: "optimizer_model.onnx" });
//   const outputs = await session.runTrainStep({ input: new Tensor("float32", x, [32, 1, 8, 8]),
//                                                labels: new Tensor("int64", y, [32]) });
//   await session.runOptimizerStep();
//   await session.lazyResetGrad();
//
// plus what ORT Web lacked: saveCheckpoint() (the checkpoint as bytes), setLearningRate() and the
// LR schedulers, exportModelForInferencing() (an ONNX model as bytes) and pre-compiled artifacts.
// Every call goes through the engine's C API (include/onnxtrain/c_api.h) in the module that
// cmake/web.cmake builds; its errors become JavaScript Errors with the engine's message, and the
// WebAssembly instance stays usable after them. Model and checkpoint bytes pass through the
// module's in-memory file system (one folder per session, removed by release()).

/** Where the module files are and how many threads to use (ORT Web's `env.wasm`). */
export const env = {
  wasm: {
    /** Threads for the kernels. 1 (default): the single-threaded module. 0: the machine's cores (at
     * most 4) and n > 1: n threads, on the threaded module where SharedArrayBuffer is usable (Node, a
     * cross-origin isolated page; make web builds it), the single-threaded module elsewhere. */
    numThreads: 1,
    /** Folder (URL or path, ending in "/") of onnxtrain_web*.js/.wasm; default: next to this file. */
    wasmPaths: undefined,
  },
};

const isNode = typeof process === "object" && typeof process.versions === "object" && !!process.versions.node;
const DTYPES = {  // ONNX's TensorProto.DataType, as the C API numbers them
  float32: [1, Float32Array], uint8: [2, Uint8Array], int8: [3, Int8Array], uint16: [4, Uint16Array],
  int16: [5, Int16Array], int32: [6, Int32Array], int64: [7, BigInt64Array], bool: [9, Uint8Array],
  float64: [11, Float64Array], uint32: [12, Uint32Array], uint64: [13, BigUint64Array],
};
const DTYPE_NAMES = Object.fromEntries(Object.entries(DTYPES).map(([name, [code]]) => [code, name]));

// A tensor's type, data and dims agree: its element count, else a TypeError/RangeError that starts
// with `where`. The constructor checks them, and every run again (the fields are plain properties).
function checkTensor(type, data, dims, where) {
  if (!(type in DTYPES)) throw new TypeError(`${where}: unsupported type '${type}' (supported: ${Object.keys(DTYPES).join(", ")})`);
  const [, Array_] = DTYPES[type];
  if (!(data instanceof Array_)) {
    throw new TypeError(`${where}: a '${type}' tensor takes a ${Array_.name}, got ${data?.constructor?.name ?? typeof data}`);
  }
  if (!Array.isArray(dims)) throw new TypeError(`${where}: dims must be an array, got ${typeof dims}`);
  for (const d of dims) {
    if (!Number.isInteger(d) || d < 0) throw new RangeError(`${where}: dims must be non-negative integers, got [${dims}]`);
  }
  const size = dims.reduce((a, b) => a * b, 1);
  if (size !== data.length) {
    throw new RangeError(`${where}: dims [${dims}] hold ${size} elements, the data has ${data.length}`);
  }
  return size;
}

/** A tensor as ORT Web has it: a type name, a typed array and its dims. */
export class Tensor {
  constructor(type, data, dims) {
    dims = dims === undefined ? data?.length === undefined ? [] : [data.length] : Array.from(dims, Number);
    const size = checkTensor(type, data, dims, "Tensor");
    this.type = type;
    this.data = data;
    this.dims = dims;
    this.size = size;
  }
}

// ---- the module: loaded once, the single-threaded or the threaded one
let loading = null;

function defaultFolder() {
  return new URL(".", import.meta.url);
}

function threadsWanted() {
  const n = env.wasm.numThreads;
  if (n === 1) return 1;
  const canShare = typeof SharedArrayBuffer !== "undefined" && (isNode || globalThis.crossOriginIsolated === true);
  if (!canShare) return 1;
  // The threaded module starts 4 workers (cmake/web.cmake, ONNXTRAIN_WEB_POOL_SIZE): at most the
  // caller and those run kernels.
  if (n > 1) return Math.min(n, 5);
  const cores = isNode ? 2 : (globalThis.navigator?.hardwareConcurrency ?? 1);
  return Math.max(1, Math.min(4, cores));
}

async function loadScript(url, globalName) {
  if (typeof importScripts === "function") {
    importScripts(url);  // a classic worker
  } else {
    await new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = url;
      script.onload = resolve;
      script.onerror = () => reject(new Error(`onnxtrain: cannot load ${url}`));
      document.head.appendChild(script);
    });
  }
  return globalThis[globalName];
}

async function instantiate() {
  const threads = threadsWanted();
  const base = env.wasm.wasmPaths ?? defaultFolder().href;
  const name = threads > 1 ? "onnxtrain_web_threaded" : "onnxtrain_web";
  const factoryName = threads > 1 ? "createOnnxtrainThreadedModule" : "createOnnxtrainModule";
  const resolve = (file) => (isNode ? new URL(file, base.startsWith("file:") ? base : `file://${base}`).pathname : new URL(file, base).href);
  const options = { locateFile: (file) => resolve(file), mainScriptUrlOrBlob: resolve(`${name}.js`) };
  let factory;
  if (isNode) {
    const { createRequire } = await import("node:module");
    const { readFileSync } = await import("node:fs");
    factory = createRequire(import.meta.url)(resolve(`${name}.js`));
    // emscripten 3.1.6 would fetch() a file path under Node 18+: hand it the bytes instead.
    options.wasmBinary = readFileSync(resolve(`${name}.wasm`));
  } else {
    factory = await loadScript(resolve(`${name}.js`), factoryName);
  }
  const m = await factory(options);
  // Node: the pool's workers (every kernel thread is one: cmake/web.cmake sizes the pool) wait for
  // the next region forever; unreferenced, they no longer keep the process alive once its own work is done.
  if (isNode && m.PThread) for (const worker of [...m.PThread.unusedWorkers, ...m.PThread.runningWorkers]) worker.unref();
  const api = bind(m);
  api.threads = threads;
  api.check(api.ot_set_num_threads(threads));
  return api;
}

function getModule() {
  if (!loading) loading = instantiate();
  return loading;
}

// The C API through cwrap; every call that returns a status goes through check().
function bind(m) {
  const fns = {
    ot_last_error: ["string", []], ot_set_num_threads: ["number", ["number"]],
    ot_tensor_info: ["number", ["number", "number", "number", "number"]],
    ot_tensor_data: ["number", ["number", "number"]], ot_tensor_release: [null, ["number"]],
    ot_checkpoint_load: ["number", ["string", "number"]],
    ot_checkpoint_save: ["number", ["number", "string", "number"]],
    ot_checkpoint_release: [null, ["number"]],
    ot_module_create: ["number", ["string", "number", "string", "number"]],
    ot_module_release: [null, ["number"]],
    ot_module_train_step: ["number", ["number", "number", "number", "number", "number"]],
    ot_module_eval_step: ["number", ["number", "number", "number", "number", "number"]],
    ot_module_lazy_reset_grad: ["number", ["number"]],
    ot_module_train: ["number", ["number"]], ot_module_eval: ["number", ["number"]],
    ot_module_input_count: ["number", ["number", "number"]],
    ot_module_input_name: ["number", ["number", "number", "number"]],
    ot_module_output_count: ["number", ["number", "number"]],
    ot_module_output_name: ["number", ["number", "number", "number"]],
    ot_module_get_parameters_size: ["number", ["number", "number", "number"]],
    ot_module_get_contiguous_parameters: ["number", ["number", "number", "number", "number", "number"]],
    ot_module_copy_buffer_to_parameters: ["number", ["number", "number", "number", "number", "number"]],
    ot_module_export_model_for_inferencing: ["number", ["number", "string", "number", "number"]],
    ot_optimizer_create: ["number", ["string", "number", "number"]],
    ot_optimizer_release: [null, ["number"]],
    ot_optimizer_step: ["number", ["number"]],
    ot_optimizer_set_learning_rate: ["number", ["number", "number"]],
    ot_optimizer_get_learning_rate: ["number", ["number", "number"]],
    ot_optimizer_step_count: ["number", ["number", "number"]],
    ot_lr_scheduler_create_linear: ["number", ["number", "number", "number", "number", "number"]],
    ot_lr_scheduler_create_cosine: ["number", ["number", "number", "number", "number", "number", "number"]],
    ot_lr_scheduler_create_step: ["number", ["number", "number", "number", "number", "number"]],
    ot_lr_scheduler_create_constant: ["number", ["number", "number", "number", "number"]],
    ot_lr_scheduler_step: ["number", ["number", "number"]],
    ot_lr_scheduler_release: [null, ["number"]],
    ot_compile_artifacts: ["number", ["string", "number", "number", "number", "number"]],
  };
  const api = { m };
  for (const [fn, [ret, args]] of Object.entries(fns)) api[fn] = m.cwrap(fn, ret, args);
  api.check = (status, what) => {
    if (status !== 0) {
      const message = api.ot_last_error();
      throw new Error(what ? `${what}: ${message}` : message);
    }
  };
  // Scratch memory for one call: freed together by free().
  api.scratch = () => {
    const blocks = [];
    return {
      alloc(bytes) {
        const p = m._malloc(Math.max(8, bytes));
        if (!p) throw new Error(`onnxtrain: out of WebAssembly memory allocating ${bytes} bytes`);
        blocks.push(p);
        return p;
      },
      free() {
        for (const p of blocks) m._free(p);
        blocks.length = 0;
      },
    };
  };
  return api;
}

// int64 values of 64-bit words through the heap (i64 getValue/setValue need BigInt in 3.1.6).
function readI64(m, ptr) {
  return Number(new BigInt64Array(m.HEAPU8.buffer, ptr, 1)[0]);
}

function readPtr(m, ptr) {
  return new Uint32Array(m.HEAPU8.buffer, ptr, 1)[0];
}

async function bytesOf(source, what) {
  if (source instanceof Uint8Array) return source;
  if (source instanceof ArrayBuffer) return new Uint8Array(source);
  if (typeof source === "string") {
    if (isNode && !/^https?:/.test(source)) {
      const { readFile } = await import("node:fs/promises");
      return new Uint8Array(await readFile(source.startsWith("file:") ? new URL(source) : source));
    }
    const response = await fetch(source);
    if (!response.ok) throw new Error(`onnxtrain: ${what} '${source}': HTTP ${response.status}`);
    return new Uint8Array(await response.arrayBuffer());
  }
  throw new TypeError(`onnxtrain: ${what} must be a URL or path (string) or a Uint8Array, got ${typeof source}`);
}

let sessionCounter = 0;

/** ONNX Runtime Web's TrainingSession (onnxruntime-web/training 1.19), over onnxtrain's engine. */
export class TrainingSession {
  /**
   * @param {{checkpointState, trainModel, evalModel?, optimizerModel?, compiled?}} options
   *   each a URL/path or the file's bytes; `compiled` optionally holds pre-compiled artifacts
   *   ({trainModel?, evalModel?, optimizerModel?}: .otc bytes from `onnxtrain compile`), used
   *   instead of building plans when they match.
   */
  static async create(options, sessionOptions = {}) {
    if (!options || typeof options !== "object") throw new TypeError("TrainingSession.create: expected {checkpointState, trainModel, ...}");
    if (!options.checkpointState || !options.trainModel) {
      throw new TypeError("TrainingSession.create: checkpointState and trainModel are required");
    }
    void sessionOptions;  // ORT's execution providers and graph options have no counterpart here
    const api = await getModule();
    const files = {};
    for (const key of ["checkpointState", "trainModel", "evalModel", "optimizerModel"]) {
      if (options[key] !== undefined && options[key] !== null) files[key] = await bytesOf(options[key], key);
    }
    const compiled = {};
    for (const key of ["trainModel", "evalModel", "optimizerModel"]) {
      const source = options.compiled?.[key];
      if (source) compiled[key] = await bytesOf(source, `compiled.${key}`);
    }
    return new TrainingSession(api, files, compiled);
  }

  /**
   * Pre-compiled artifacts for these input shapes ({name: dims}): {trainModel, evalModel,
   * optimizerModel} as .otc bytes (the graphs as the engine runs them, their kernels and memory
   * plans), which create({..., compiled}) then loads instead of planning; keep them with the
   * artifacts (IndexedDB, a server). Stale or damaged ones are ignored, with a note on the console.
   */
  static async compileArtifacts(options, shapes) {
    const api = await getModule();
    const { m } = api;
    const dir = `/onnxtrain_compile_${++sessionCounter}`;
    const names = { checkpointState: "checkpoint", trainModel: "training_model.onnx", evalModel: "eval_model.onnx",
                    optimizerModel: "optimizer_model.onnx" };
    const scratch = api.scratch();
    m.FS.mkdir(dir);
    try {
      for (const [key, file] of Object.entries(names)) {
        if (options?.[key] !== undefined && options[key] !== null) m.FS.writeFile(`${dir}/${file}`, await bytesOf(options[key], key));
      }
      const entries = Object.entries(shapes ?? {});
      const namePtrs = scratch.alloc(4 * entries.length), dimPtrs = scratch.alloc(4 * entries.length);
      const ranks = scratch.alloc(4 * entries.length);
      entries.forEach(([name, dims], i) => {
        if (!Array.isArray(dims) || !dims.every((d) => Number.isInteger(d) && d >= 0)) {
          throw new TypeError(`TrainingSession.compileArtifacts: dims of '${name}' must be non-negative integers`);
        }
        const bytes = m.lengthBytesUTF8(name) + 1, p = scratch.alloc(bytes);
        m.stringToUTF8(name, p, bytes);
        const d = scratch.alloc(8 * dims.length);
        new BigInt64Array(m.HEAPU8.buffer, d, dims.length).set(dims.map(BigInt));
        new Uint32Array(m.HEAPU8.buffer, namePtrs + 4 * i, 1)[0] = p;
        new Uint32Array(m.HEAPU8.buffer, dimPtrs + 4 * i, 1)[0] = d;
        new Uint32Array(m.HEAPU8.buffer, ranks + 4 * i, 1)[0] = dims.length;
      });
      api.check(api.ot_compile_artifacts(dir, namePtrs, dimPtrs, ranks, entries.length), "TrainingSession.compileArtifacts");
      const out = {};
      for (const key of ["trainModel", "evalModel", "optimizerModel"]) {
        const path = `${dir}/${names[key].replace(/\.onnx$/, ".otc")}`;
        if (m.FS.analyzePath(path).exists) out[key] = m.FS.readFile(path);
      }
      return out;
    } finally {
      scratch.free();
      for (const entry of m.FS.readdir(dir)) if (entry !== "." && entry !== "..") m.FS.unlink(`${dir}/${entry}`);
      m.FS.rmdir(dir);
    }
  }

  constructor(api, files, compiled) {
    this._api = api;
    const { m } = api;
    const dir = `/onnxtrain_session_${++sessionCounter}`;
    m.FS.mkdir(dir);
    this._dir = dir;
    const names = { checkpointState: "checkpoint", trainModel: "training_model.onnx", evalModel: "eval_model.onnx",
                    optimizerModel: "optimizer_model.onnx" };
    const paths = {};
    for (const [key, bytes] of Object.entries(files)) {
      paths[key] = `${dir}/${names[key]}`;
      m.FS.writeFile(paths[key], bytes);
    }
    for (const [key, bytes] of Object.entries(compiled)) m.FS.writeFile(`${dir}/${names[key].replace(/\.onnx$/, ".otc")}`, bytes);
    const out = m._malloc(8);
    try {
      api.check(api.ot_checkpoint_load(paths.checkpointState, out), "TrainingSession.create: checkpointState");
      this._checkpoint = readPtr(m, out);
      api.check(api.ot_module_create(paths.trainModel, this._checkpoint, paths.evalModel ?? "", out),
                "TrainingSession.create: trainModel/evalModel");
      this._module = readPtr(m, out);
      this._optimizer = 0;
      if (paths.optimizerModel) {
        api.check(api.ot_optimizer_create(paths.optimizerModel, this._module, out), "TrainingSession.create: optimizerModel");
        this._optimizer = readPtr(m, out);
      }
      this.trainingInputNames = this._names(true, "input");
      this.trainingOutputNames = this._names(true, "output");
      this.hasEvalModel = !!paths.evalModel;
      this.evalInputNames = this.hasEvalModel ? this._names(false, "input") : [];
      this.evalOutputNames = this.hasEvalModel ? this._names(false, "output") : [];
    } catch (e) {
      this._releaseHandles();
      throw e;
    } finally {
      m._free(out);
      for (const entry of m.FS.readdir(dir)) if (entry !== "." && entry !== "..") m.FS.unlink(`${dir}/${entry}`);
    }
    this._scheduler = 0;
  }

  _names(training, kind) {
    const { _api: api } = this;
    const { m } = api;
    const out = m._malloc(8);
    try {
      api.check(training ? api.ot_module_train(this._module) : api.ot_module_eval(this._module));
      api.check(api[`ot_module_${kind}_count`](this._module, out));
      const count = readPtr(m, out);
      const names = [];
      for (let i = 0; i < count; ++i) {
        api.check(api[`ot_module_${kind}_name`](this._module, i, out));
        names.push(m.UTF8ToString(readPtr(m, out)));
      }
      return names;
    } finally {
      api.check(api.ot_module_train(this._module));
      m._free(out);
    }
  }

  _alive(what) {
    if (!this._module) throw new Error(`TrainingSession.${what}: the session was released`);
  }

  _releaseHandles() {
    const api = this._api;
    if (this._scheduler) api.ot_lr_scheduler_release(this._scheduler);
    if (this._optimizer) api.ot_optimizer_release(this._optimizer);
    if (this._module) api.ot_module_release(this._module);
    if (this._checkpoint) api.ot_checkpoint_release(this._checkpoint);
    this._scheduler = this._optimizer = this._module = this._checkpoint = 0;
  }

  // Feeds (by name) to an OtTensorView array in the module's memory; outputs back to Tensors.
  _run(training, feeds, fetches, what) {
    this._alive(what);
    const api = this._api;
    const { m } = api;
    const inputNames = training ? this.trainingInputNames : this.evalInputNames;
    const outputNames = training ? this.trainingOutputNames : this.evalOutputNames;
    if (!training && !this.hasEvalModel) throw new Error(`TrainingSession.${what}: the session has no eval model`);
    if (!feeds || typeof feeds !== "object") throw new TypeError(`TrainingSession.${what}: feeds must be an object of Tensors by input name`);
    for (const name of Object.keys(feeds)) {
      if (!inputNames.includes(name)) {
        throw new Error(`TrainingSession.${what}: '${name}' is not an input (inputs: ${inputNames.join(", ")})`);
      }
    }
    const scratch = api.scratch();
    const outputs = [];
    try {
      const views = scratch.alloc(16 * inputNames.length);
      inputNames.forEach((name, i) => {
        const t = feeds[name];
        if (t === undefined) throw new Error(`TrainingSession.${what}: input '${name}' is missing (inputs: ${inputNames.join(", ")})`);
        if (!(t instanceof Tensor)) throw new TypeError(`TrainingSession.${what}: input '${name}' must be a Tensor`);
        // Checked again: a Tensor's fields may have changed since it was made.
        checkTensor(t.type, t.data, t.dims, `TrainingSession.${what}: input '${name}'`);
        const data = scratch.alloc(t.data.byteLength);
        m.HEAPU8.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), data);
        const shape = scratch.alloc(8 * t.dims.length);
        new BigInt64Array(m.HEAPU8.buffer, shape, t.dims.length).set(t.dims.map(BigInt));
        new Uint32Array(m.HEAPU8.buffer, views + 16 * i, 4).set([data, DTYPES[t.type][0], shape, t.dims.length]);
      });
      const outs = scratch.alloc(4 * outputNames.length);
      m.HEAPU8.fill(0, outs, outs + 4 * outputNames.length);
      const step = training ? api.ot_module_train_step : api.ot_module_eval_step;
      api.check(step(this._module, views, inputNames.length, outs, outputNames.length), `TrainingSession.${what}`);
      for (let i = 0; i < outputNames.length; ++i) outputs.push(readPtr(m, outs + 4 * i));
      const result = {};
      const wanted = fetches ? (Array.isArray(fetches) ? fetches : Object.keys(fetches)) : outputNames;
      for (const name of wanted) {
        if (!outputNames.includes(name)) throw new Error(`TrainingSession.${what}: '${name}' is not an output (outputs: ${outputNames.join(", ")})`);
      }
      outputNames.forEach((name, i) => {
        if (wanted.includes(name)) result[name] = this._tensorOf(outputs[i], scratch);
      });
      return result;
    } finally {
      for (const t of outputs) if (t) api.ot_tensor_release(t);
      scratch.free();
    }
  }

  _tensorOf(handle, scratch) {
    const api = this._api;
    const { m } = api;
    const info = scratch.alloc(16);
    api.check(api.ot_tensor_info(handle, info, info + 4, info + 8));
    const [code, shapePtr, rank] = new Uint32Array(m.HEAPU8.buffer, info, 3);
    api.check(api.ot_tensor_data(handle, info + 12));
    const dataPtr = readPtr(m, info + 12);
    const dims = Array.from({ length: rank }, (_, k) => readI64(m, shapePtr + 8 * k));
    const type = DTYPE_NAMES[code];
    if (!type) throw new Error(`onnxtrain: an output of dtype ${code} has no JavaScript typed array`);
    const Array_ = DTYPES[type][1];
    const size = dims.reduce((a, b) => a * b, 1);
    const data = new Array_(size);
    new Uint8Array(data.buffer).set(m.HEAPU8.subarray(dataPtr, dataPtr + size * Array_.BYTES_PER_ELEMENT));
    return new Tensor(type, data, dims);
  }

  // ---- ORT Web's TrainingSession
  /** Forward, backward and gradient accumulation: {outputName: Tensor} (the loss first). */
  async runTrainStep(feeds, fetchesOrOptions) {
    return this._run(true, feeds, Array.isArray(fetchesOrOptions) ? fetchesOrOptions : undefined, "runTrainStep");
  }

  /** One update of every trainable parameter from the accumulated gradients. */
  async runOptimizerStep() {
    this._alive("runOptimizerStep");
    if (!this._optimizer) throw new Error("TrainingSession.runOptimizerStep: the session has no optimizer model");
    this._api.check(this._api.ot_optimizer_step(this._optimizer), "TrainingSession.runOptimizerStep");
  }

  /** Forward and loss on the eval model (inference-mode Dropout and BatchNorm). */
  async runEvalStep(feeds, fetchesOrOptions) {
    return this._run(false, feeds, Array.isArray(fetchesOrOptions) ? fetchesOrOptions : undefined, "runEvalStep");
  }

  /** The next train step overwrites the gradients instead of adding to them. */
  async lazyResetGrad() {
    this._alive("lazyResetGrad");
    this._api.check(this._api.ot_module_lazy_reset_grad(this._module), "TrainingSession.lazyResetGrad");
  }

  /** Number of (trainable) parameter elements. */
  async getParametersSize(trainableOnly = true) {
    this._alive("getParametersSize");
    const { _api: api } = this;
    const out = api.m._malloc(8);
    try {
      api.check(api.ot_module_get_parameters_size(this._module, trainableOnly ? 1 : 0, out), "TrainingSession.getParametersSize");
      return readI64(api.m, out);
    } finally {
      api.m._free(out);
    }
  }

  /** The (trainable) parameters, concatenated in checkpoint order: a float32 Tensor [size]. */
  async getContiguousParameters(trainableOnly = true) {
    const size = await this.getParametersSize(trainableOnly);
    const { _api: api } = this;
    const scratch = api.scratch();
    try {
      const buffer = scratch.alloc(4 * size);
      api.check(api.ot_module_get_contiguous_parameters(this._module, trainableOnly ? 1 : 0, buffer, 1, BigInt(size)),
                "TrainingSession.getContiguousParameters");
      return new Tensor("float32", new Float32Array(api.m.HEAPU8.buffer.slice(buffer, buffer + 4 * size)), [size]);
    } finally {
      scratch.free();
    }
  }

  /** Sets the (trainable) parameters from float32 bytes, as getContiguousParameters gives them. */
  async loadParametersBuffer(buffer, trainableOnly = true) {
    this._alive("loadParametersBuffer");
    if (!(buffer instanceof Uint8Array)) throw new TypeError("TrainingSession.loadParametersBuffer: expected a Uint8Array");
    if (buffer.byteLength % 4 !== 0) {
      throw new RangeError(`TrainingSession.loadParametersBuffer: ${buffer.byteLength} bytes are not a whole number of float32 values`);
    }
    const { _api: api } = this;
    const scratch = api.scratch();
    try {
      const p = scratch.alloc(buffer.byteLength);
      api.m.HEAPU8.set(buffer, p);
      api.check(api.ot_module_copy_buffer_to_parameters(this._module, trainableOnly ? 1 : 0, p, 1, BigInt(buffer.byteLength / 4)),
                "TrainingSession.loadParametersBuffer");
    } finally {
      scratch.free();
    }
  }

  /** Frees the engine's objects; any later call is an Error. */
  async release() {
    if (!this._module) return;
    this._releaseHandles();
    this._api.m.FS.rmdir(this._dir);
  }

  // ---- beyond ORT Web
  /** The checkpoint (parameters and, by default, optimizer state) as the bytes of a checkpoint file
   * that onnxtrain (C++, C, Python, this module) loads. */
  async saveCheckpoint({ includeOptimizerState = true } = {}) {
    this._alive("saveCheckpoint");
    const { _api: api } = this;
    const path = `${this._dir}/checkpoint.out`;
    api.check(api.ot_checkpoint_save(this._checkpoint, path, includeOptimizerState ? 1 : 0), "TrainingSession.saveCheckpoint");
    const bytes = api.m.FS.readFile(path);
    api.m.FS.unlink(path);
    return bytes;
  }

  /** The eval model with the current parameters and the named outputs, as ONNX bytes. */
  async exportModelForInferencing(outputNames) {
    this._alive("exportModelForInferencing");
    if (!this.hasEvalModel) throw new Error("TrainingSession.exportModelForInferencing: the session has no eval model");
    if (!Array.isArray(outputNames) || outputNames.length === 0 || !outputNames.every((n) => typeof n === "string")) {
      throw new TypeError("TrainingSession.exportModelForInferencing: expected a non-empty array of output names");
    }
    const { _api: api } = this;
    const { m } = api;
    const path = `${this._dir}/inference.onnx`;
    const scratch = api.scratch();
    try {
      const names = scratch.alloc(4 * outputNames.length);
      outputNames.forEach((name, i) => {
        const bytes = m.lengthBytesUTF8(name) + 1;
        const p = scratch.alloc(bytes);
        m.stringToUTF8(name, p, bytes);
        new Uint32Array(m.HEAPU8.buffer, names + 4 * i, 1)[0] = p;
      });
      api.check(api.ot_module_export_model_for_inferencing(this._module, path, names, outputNames.length),
                "TrainingSession.exportModelForInferencing");
      const bytes = m.FS.readFile(path);
      m.FS.unlink(path);
      return bytes;
    } finally {
      scratch.free();
    }
  }

  _optimizerOrThrow(what) {
    this._alive(what);
    if (!this._optimizer) throw new Error(`TrainingSession.${what}: the session has no optimizer model`);
    return this._optimizer;
  }

  async setLearningRate(lr) {
    const opt = this._optimizerOrThrow("setLearningRate");
    if (typeof lr !== "number" || !Number.isFinite(lr)) throw new TypeError("TrainingSession.setLearningRate: expected a finite number");
    this._api.check(this._api.ot_optimizer_set_learning_rate(opt, lr), "TrainingSession.setLearningRate");
  }

  async getLearningRate() {
    return this._readDouble(this._optimizerOrThrow("getLearningRate"), "ot_optimizer_get_learning_rate", "getLearningRate");
  }

  /** Optimizer steps taken (kept in the checkpoint, so schedules resume where they stopped). */
  async getStepCount() {
    const opt = this._optimizerOrThrow("getStepCount");
    const { _api: api } = this;
    const out = api.m._malloc(8);
    try {
      api.check(api.ot_optimizer_step_count(opt, out), "TrainingSession.getStepCount");
      return readI64(api.m, out);
    } finally {
      api.m._free(out);
    }
  }

  _readDouble(handle, fn, what) {
    const { _api: api } = this;
    const out = api.m._malloc(8);
    try {
      api.check(api[fn](handle, out), `TrainingSession.${what}`);
      return new Float64Array(api.m.HEAPU8.buffer, out, 1)[0];
    } finally {
      api.m._free(out);
    }
  }

  /**
   * A learning-rate schedule with ONNX Runtime's semantics, applied now and by every
   * schedulerStep() (call it after runOptimizerStep()). One of
   *   {type: "linear", warmupSteps, totalSteps, initialLr}    ORT's LinearLRScheduler
   *   {type: "cosine", warmupSteps, totalSteps, initialLr, numCycles = 0.5}
   *   {type: "step", stepSize, gamma, initialLr}              torch's StepLR
   *   {type: "constant", warmupSteps, initialLr}
   */
  async setLRScheduler(schedule) {
    const opt = this._optimizerOrThrow("setLRScheduler");
    const { _api: api } = this;
    const int = (v, name) => {
      if (!Number.isInteger(v) || v < 0) throw new TypeError(`TrainingSession.setLRScheduler: ${name} must be a non-negative integer, got ${v}`);
      return BigInt(v);
    };
    const out = api.m._malloc(8);
    try {
      const s = schedule ?? {};
      let status;
      switch (s.type) {
        case "linear": status = api.ot_lr_scheduler_create_linear(opt, int(s.warmupSteps, "warmupSteps"), int(s.totalSteps, "totalSteps"), s.initialLr, out); break;
        case "cosine": status = api.ot_lr_scheduler_create_cosine(opt, int(s.warmupSteps, "warmupSteps"), int(s.totalSteps, "totalSteps"), s.initialLr, s.numCycles ?? 0.5, out); break;
        case "step": status = api.ot_lr_scheduler_create_step(opt, int(s.stepSize, "stepSize"), s.gamma, s.initialLr, out); break;
        case "constant": status = api.ot_lr_scheduler_create_constant(opt, int(s.warmupSteps, "warmupSteps"), s.initialLr, out); break;
        default: throw new TypeError(`TrainingSession.setLRScheduler: type must be linear, cosine, step or constant, got '${s.type}'`);
      }
      api.check(status, "TrainingSession.setLRScheduler");
      if (this._scheduler) api.ot_lr_scheduler_release(this._scheduler);
      this._scheduler = readPtr(api.m, out);
    } finally {
      api.m._free(out);
    }
  }

  /** Sets the learning rate for the optimizer's current step count; returns it. */
  async schedulerStep() {
    this._alive("schedulerStep");
    if (!this._scheduler) throw new Error("TrainingSession.schedulerStep: no scheduler (call setLRScheduler first)");
    return this._readDouble(this._scheduler, "ot_lr_scheduler_step", "schedulerStep");
  }

  /** Threads the module's kernels run on (1: the single-threaded module). */
  get numThreads() {
    return this._api.threads;
  }
}
