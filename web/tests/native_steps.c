/* The native side of the WebAssembly module's tests (the .test.mjs files beside it): the same train steps
 * on the native minimal build, through the same C API, printed as JSON.
 *
 *   web_native_steps ARTIFACT_DIR CHECKPOINT DATA_DIR STEPS BATCH [LEARNING_RATE]
 *
 * Loads CHECKPOINT with ARTIFACT_DIR's training, eval and optimizer models, runs STEPS train steps
 * (each followed by an optimizer step and lazy_reset_grad) on batch i = training rows
 * [(i mod floor(N / BATCH)) * BATCH, + BATCH) of DATA_DIR's x_train.f32 / y_train.i64, then one eval
 * step on batch 0, and prints {"losses": [...], "eval_loss": x, "logits0": [...]}. LEARNING_RATE
 * replaces the optimizer model's. The kernels run on ONNXTRAIN_WEB_NATIVE_THREADS threads (default 1): the
 * threaded WebAssembly module's tests compare with the same thread count, so both split the work alike. */
#include <stdio.h>
#include <stdlib.h>

#include "onnxtrain/c_api.h"

#define CHECK(call)                                                                              \
  do {                                                                                           \
    if ((call) != OT_OK) {                                                                       \
      fprintf(stderr, "%s failed: %s\n", #call, ot_last_error());                                \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

static void* read_file(const char* dir, const char* name, long* size) {
  char path[4096];
  FILE* f;
  void* data;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  f = fopen(path, "rb");
  if (!f || fseek(f, 0, SEEK_END) != 0 || (*size = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  data = malloc((size_t)*size);
  if (!data || fread(data, 1, (size_t)*size, f) != (size_t)*size) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  fclose(f);
  return data;
}

static float scalar_of(OtTensor* t) {
  const void* data;
  CHECK(ot_tensor_data(t, &data));
  return *(const float*)data;
}

int main(int argc, char** argv) {
  char train_path[4096], eval_path[4096], opt_path[4096];
  long x_bytes, y_bytes;
  float* x;
  long long* y;
  long n, batches, steps, batch, i;
  const char* threads;
  OtCheckpoint* checkpoint;
  OtModule* module;
  OtOptimizer* optimizer;
  OtTensor* outputs[2] = {NULL, NULL};
  const float* logits;
  if (argc != 6 && argc != 7) {
    fprintf(stderr, "usage: %s ARTIFACT_DIR CHECKPOINT DATA_DIR STEPS BATCH [LEARNING_RATE]\n", argv[0]);
    return 2;
  }
  steps = atol(argv[4]);
  batch = atol(argv[5]);
  x = read_file(argv[3], "x_train.f32", &x_bytes);
  y = read_file(argv[3], "y_train.i64", &y_bytes);
  n = y_bytes / 8;
  batches = n / batch;
  if (batch <= 0 || batches <= 0 || x_bytes != n * 64 * 4) {
    fprintf(stderr, "bad batch %ld or data (%ld images, %ld bytes of pixels)\n", batch, n, x_bytes);
    return 2;
  }
  snprintf(train_path, sizeof train_path, "%s/training_model.onnx", argv[1]);
  snprintf(eval_path, sizeof eval_path, "%s/eval_model.onnx", argv[1]);
  snprintf(opt_path, sizeof opt_path, "%s/optimizer_model.onnx", argv[1]);
  threads = getenv("ONNXTRAIN_WEB_NATIVE_THREADS");
  CHECK(ot_set_num_threads(threads ? atoi(threads) : 1));
  CHECK(ot_checkpoint_load(argv[2], &checkpoint));
  CHECK(ot_module_create(train_path, checkpoint, eval_path, &module));
  CHECK(ot_optimizer_create(opt_path, module, &optimizer));
  if (argc == 7) CHECK(ot_optimizer_set_learning_rate(optimizer, atof(argv[6])));
  printf("{\"losses\": [");
  for (i = 0; i <= steps; ++i) {
    const long start = (i == steps ? 0 : i % batches) * batch;
    const int64_t x_shape[4] = {batch, 1, 8, 8}, y_shape[1] = {batch};
    OtTensorView inputs[2] = {{x + start * 64, OT_DTYPE_FLOAT32, x_shape, 4}, {y + start, OT_DTYPE_INT64, y_shape, 1}};
    if (i == steps) {  /* the eval step on batch 0 */
      CHECK(ot_module_eval_step(module, inputs, 2, outputs, 2));
      break;
    }
    CHECK(ot_module_train_step(module, inputs, 2, outputs, 2));
    printf("%s%.9g", i ? ", " : "", scalar_of(outputs[0]));
    ot_tensor_release(outputs[0]);
    ot_tensor_release(outputs[1]);
    CHECK(ot_optimizer_step(optimizer));
    CHECK(ot_module_lazy_reset_grad(module));
  }
  printf("], \"eval_loss\": %.9g, \"logits0\": [", scalar_of(outputs[0]));
  CHECK(ot_tensor_data(outputs[1], (const void**)&logits));
  for (i = 0; i < 10; ++i) printf("%s%.9g", i ? ", " : "", logits[i]);
  printf("]}\n");
  ot_tensor_release(outputs[0]);
  ot_tensor_release(outputs[1]);
  ot_optimizer_release(optimizer);
  ot_module_release(module);
  ot_checkpoint_release(checkpoint);
  free(x);
  free(y);
  return 0;
}
