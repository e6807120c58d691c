// Compiled by tsc --noEmit --strict (make test-web) against web/onnxtrain.d.ts: an ONNX Runtime Web
// training loop, as written for onnxruntime-web/training 1.19, type-checks with only its import
// changed; and the additions have the types the module gives them.
import { TrainingSession, Tensor, env } from "../onnxtrain.mjs";

export async function trainLoop(x: Float32Array, y: BigInt64Array): Promise<number> {
  env.wasm.numThreads = 1;
  const session = await TrainingSession.create({
    checkpointState: "checkpoint", trainModel: "training_model.onnx",
    evalModel: "eval_model.onnx", optimizerModel: "optimizer_model.onnx",
  });
  const feeds = { [session.trainingInputNames[0]]: new Tensor("float32", x, [x.length / 64, 1, 8, 8]),
                  [session.trainingInputNames[1]]: new Tensor("int64", y, [y.length]) };
  const results = await session.runTrainStep(feeds);
  const loss = results[session.trainingOutputNames[0]].data as Float32Array;
  await session.runOptimizerStep();
  await session.lazyResetGrad();
  await session.runEvalStep(feeds, ["loss"]);
  const size: number = await session.getParametersSize(true);
  const params: Tensor<"float32"> = await session.getContiguousParameters(true);
  await session.loadParametersBuffer(new Uint8Array(params.data.buffer), true);
  // Beyond ORT Web.
  const checkpoint: Uint8Array = await session.saveCheckpoint({ includeOptimizerState: false });
  const model: Uint8Array = await session.exportModelForInferencing(["logits"]);
  await session.setLRScheduler({ type: "cosine", warmupSteps: 10, totalSteps: 100, initialLr: 1e-3 });
  const lr: number = await session.schedulerStep();
  const compiled = await TrainingSession.compileArtifacts({ checkpointState: checkpoint, trainModel: model }, { input: [32, 1, 8, 8] });
  await session.release();
  return loss[0] + size + lr + (compiled.trainModel?.length ?? 0);
}
