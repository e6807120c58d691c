// TypeScript declarations of web/onnxtrain.mjs (.d.mts: the types of an .mjs module): ONNX Runtime Web's training API
// (onnxruntime-web/training 1.19) over onnxtrain's WebAssembly module, and what it adds.

export type TensorType = "float32" | "uint8" | "int8" | "uint16" | "int16" | "int32" | "int64" | "bool" |
  "float64" | "uint32" | "uint64";

export interface TensorDataTypeMap {
  float32: Float32Array; uint8: Uint8Array; int8: Int8Array; uint16: Uint16Array; int16: Int16Array;
  int32: Int32Array; int64: BigInt64Array; bool: Uint8Array; float64: Float64Array; uint32: Uint32Array;
  uint64: BigUint64Array;
}

/** A tensor as ORT Web has it; the data's length must equal the product of the dims. */
export class Tensor<T extends TensorType = TensorType> {
  constructor(type: T, data: TensorDataTypeMap[T], dims?: readonly number[]);
  readonly type: T;
  readonly data: TensorDataTypeMap[T];
  readonly dims: readonly number[];
  readonly size: number;
}

export const env: {
  wasm: {
    /** 1 (default): the single-threaded module. 0 (up to 4 cores) or n > 1: the threaded module where
     * SharedArrayBuffer is usable (Node, a cross-origin isolated page); elsewhere one thread. */
    numThreads: number;
    /** Folder (URL or path, ending in "/") of onnxtrain_web*.js/.wasm; default: next to onnxtrain.mjs. */
    wasmPaths?: string;
  };
};

/** A URL or file path (Node), or the file's bytes. */
export type URIorBuffer = string | Uint8Array | ArrayBuffer;

export type OnnxValueMapType = Record<string, Tensor>;
export type FeedsType = Record<string, Tensor>;
export type FetchesType = readonly string[];

export interface CompiledArtifacts {
  trainModel?: Uint8Array;
  evalModel?: Uint8Array;
  optimizerModel?: Uint8Array;
}

export interface TrainingSessionCreateOptions {
  checkpointState: URIorBuffer;
  trainModel: URIorBuffer;
  evalModel?: URIorBuffer;
  optimizerModel?: URIorBuffer;
  /** Pre-compiled artifacts (TrainingSession.compileArtifacts); ignored, with a note, when stale. */
  compiled?: { trainModel?: URIorBuffer; evalModel?: URIorBuffer; optimizerModel?: URIorBuffer };
}

export type LRSchedule =
  | { type: "linear"; warmupSteps: number; totalSteps: number; initialLr: number }
  | { type: "cosine"; warmupSteps: number; totalSteps: number; initialLr: number; numCycles?: number }
  | { type: "step"; stepSize: number; gamma: number; initialLr: number }
  | { type: "constant"; warmupSteps: number; initialLr: number };

export class TrainingSession {
  /** sessionOptions (ORT's execution providers, graph options) is accepted and ignored. */
  static create(options: TrainingSessionCreateOptions, sessionOptions?: unknown): Promise<TrainingSession>;
  /** .otc bytes of the three graphs planned for these input shapes ({name: dims}). */
  static compileArtifacts(options: TrainingSessionCreateOptions, shapes: Record<string, number[]>): Promise<CompiledArtifacts>;

  readonly trainingInputNames: readonly string[];
  readonly trainingOutputNames: readonly string[];
  readonly evalInputNames: readonly string[];
  readonly evalOutputNames: readonly string[];
  readonly hasEvalModel: boolean;
  /** Threads the kernels run on (1: the single-threaded module). */
  readonly numThreads: number;

  /** Forward, backward and gradient accumulation; outputs by name (the loss first). */
  runTrainStep(feeds: FeedsType, fetches?: FetchesType): Promise<OnnxValueMapType>;
  runOptimizerStep(): Promise<void>;
  /** Forward and loss on the eval model (inference-mode Dropout and BatchNorm). */
  runEvalStep(feeds: FeedsType, fetches?: FetchesType): Promise<OnnxValueMapType>;
  lazyResetGrad(): Promise<void>;
  getParametersSize(trainableOnly?: boolean): Promise<number>;
  /** A float32 tensor [size] of the (trainable) parameters in checkpoint order. */
  getContiguousParameters(trainableOnly?: boolean): Promise<Tensor<"float32">>;
  /** float32 bytes as getContiguousParameters gives them. */
  loadParametersBuffer(buffer: Uint8Array, trainableOnly?: boolean): Promise<void>;
  release(): Promise<void>;

  /** The checkpoint file's bytes (onnxtrain's format; C++, C, Python and this module load it). */
  saveCheckpoint(options?: { includeOptimizerState?: boolean }): Promise<Uint8Array>;
  /** The eval model with the current parameters and these outputs, as ONNX bytes. */
  exportModelForInferencing(outputNames: readonly string[]): Promise<Uint8Array>;
  setLearningRate(lr: number): Promise<void>;
  getLearningRate(): Promise<number>;
  getStepCount(): Promise<number>;
  /** Applies the schedule now and at every schedulerStep() (call it after runOptimizerStep()). */
  setLRScheduler(schedule: LRSchedule): Promise<void>;
  schedulerStep(): Promise<number>;
}
