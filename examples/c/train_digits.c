/* On-device training from plain C (include/onnxtrain/c_api.h) with prepared artifacts: the
 * program a device runs, which needs neither Python nor artifact generation, so it runs on the
 * minimal runtime (make minimal, make cross-aarch64) as on the full build.
 *
 *   train_digits_c ARTIFACT_DIR DATA_DIR OUT_DIR MIN_ACCURACY [EPOCHS] [BATCH]
 *
 * ARTIFACT_DIR: training_model.onnx, eval_model.onnx, optimizer_model.onnx, checkpoint (examples/
 * demo.py writes them for the digits CNN). DATA_DIR: x_train.f32, y_train.i64, x_test.f32,
 * y_test.i64, the arrays as raw little-endian values (numpy's tofile; demo.py writes them next to
 * digits.npz), images of 1x8x8 floats and int64 labels 0-9. Trains with AdamW under a linear
 * schedule (one epoch of warmup), saves OUT_DIR/checkpoint (OUT_DIR must exist), exports
 * OUT_DIR/model.onnx, and exits 1 when that model's held-out accuracy is below MIN_ACCURACY. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnxtrain/c_api.h"

#define CHECK(call)                                                                                 \
  do {                                                                                              \
    OtStatus status_ = (call);                                                                      \
    if (status_ != OT_OK) {                                                                         \
      fprintf(stderr, "%s failed (%s): %s\n", #call, ot_status_name(status_), ot_last_error());    \
      exit(1);                                                                                      \
    }                                                                                               \
  } while (0)

enum { PIXELS = 64, CLASSES = 10, MAX_OUTPUTS = 8 };

static void path_join(char* out, size_t size, const char* dir, const char* name) {
  if ((size_t)snprintf(out, size, "%s/%s", dir, name) >= size) {
    fprintf(stderr, "path too long: %s/%s\n", dir, name);
    exit(1);
  }
}

/* The whole file; *count = its size in elements of elem_size bytes. */
static void* read_array(const char* dir, const char* name, size_t elem_size, size_t* count) {
  char path[1024];
  FILE* f;
  long size;
  void* data;
  path_join(path, sizeof path, dir, name);
  f = fopen(path, "rb");
  if (!f || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  if (size == 0 || (size_t)size % elem_size != 0) {
    fprintf(stderr, "%s: %ld bytes is not a whole number of %d-byte values\n", path, size, (int)elem_size);
    exit(1);
  }
  data = malloc((size_t)size);
  if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  fclose(f);
  *count = (size_t)size / elem_size;
  return data;
}

static unsigned long long rng_state = 0x9E3779B97F4A7C15ULL;

static unsigned long long next_random(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ULL;
}

static int argmax_row(const float* row) {
  int c, best = 0;
  for (c = 1; c < CLASSES; ++c)
    if (row[c] > row[best]) best = c;
  return best;
}

int main(int argc, char** argv) {
  static const char* const logits_name[] = {"logits"};
  const char *artifacts, *data_dir, *out_dir;
  char path[1024], training_path[1024], eval_path[1024], checkpoint_path[1024], model_path[1024];
  double min_accuracy, lr = 0, accuracy;
  int epochs, batch, epoch, step, i, j, steps, correct = 0;
  size_t n_train, n_test, n_labels, n_outputs;
  float *x_train, *x_test, *batch_x;
  int64_t *y_train, *y_test, *batch_y;
  int* order;
  OtCheckpoint* checkpoint = NULL;
  OtModule* module = NULL;
  OtOptimizer* optimizer = NULL;
  OtLRScheduler* scheduler = NULL;
  OtInferenceSession* session = NULL;

  if (argc < 5 || argc > 7) {
    fprintf(stderr, "usage: %s ARTIFACT_DIR DATA_DIR OUT_DIR MIN_ACCURACY [EPOCHS] [BATCH]\n", argv[0]);
    return 2;
  }
  artifacts = argv[1], data_dir = argv[2], out_dir = argv[3];
  min_accuracy = atof(argv[4]);
  epochs = argc > 5 ? atoi(argv[5]) : 20;
  batch = argc > 6 ? atoi(argv[6]) : 32;
  if (epochs < 1 || batch < 1) {
    fprintf(stderr, "EPOCHS and BATCH must be at least 1\n");
    return 2;
  }

  /* The data: images and labels must agree in count. */
  x_train = (float*)read_array(data_dir, "x_train.f32", sizeof(float), &n_train);
  y_train = (int64_t*)read_array(data_dir, "y_train.i64", sizeof(int64_t), &n_labels);
  if (n_train != n_labels * PIXELS) {
    fprintf(stderr, "x_train.f32 holds %d values for %d labels (64 each expected)\n", (int)n_train, (int)n_labels);
    return 1;
  }
  n_train = n_labels;
  x_test = (float*)read_array(data_dir, "x_test.f32", sizeof(float), &n_test);
  y_test = (int64_t*)read_array(data_dir, "y_test.i64", sizeof(int64_t), &n_labels);
  if (n_test != n_labels * PIXELS) {
    fprintf(stderr, "x_test.f32 holds %d values for %d labels (64 each expected)\n", (int)n_test, (int)n_labels);
    return 1;
  }
  n_test = n_labels;
  printf("%d training and %d test images\n", (int)n_train, (int)n_test);

  /* The training objects over the prepared artifacts. */
  path_join(checkpoint_path, sizeof checkpoint_path, artifacts, "checkpoint");
  path_join(training_path, sizeof training_path, artifacts, "training_model.onnx");
  path_join(eval_path, sizeof eval_path, artifacts, "eval_model.onnx");
  path_join(path, sizeof path, artifacts, "optimizer_model.onnx");
  CHECK(ot_checkpoint_load(checkpoint_path, &checkpoint));
  CHECK(ot_module_create(training_path, checkpoint, eval_path, &module));
  CHECK(ot_optimizer_create(path, module, &optimizer));
  CHECK(ot_optimizer_get_learning_rate(optimizer, &lr));
  CHECK(ot_module_output_count(module, &n_outputs));
  if (n_outputs < 1 || n_outputs > MAX_OUTPUTS) {
    fprintf(stderr, "the training model has %d outputs, 1 to %d expected\n", (int)n_outputs, MAX_OUTPUTS);
    return 1;
  }
  steps = (int)(n_train / (size_t)batch);
  if (steps < 1) {
    fprintf(stderr, "BATCH %d is larger than the %d training images\n", batch, (int)n_train);
    return 2;
  }
  CHECK(ot_lr_scheduler_create_linear(optimizer, steps, (int64_t)epochs * steps, lr, &scheduler));

  /* The loop: shuffle, then train step, optimizer step, reset gradients, schedule. */
  batch_x = (float*)malloc(sizeof(float) * (size_t)batch * PIXELS);
  batch_y = (int64_t*)malloc(sizeof(int64_t) * (size_t)batch);
  order = (int*)malloc(sizeof(int) * n_train);
  if (!batch_x || !batch_y || !order) return 1;
  for (i = 0; i < (int)n_train; ++i) order[i] = i;
  for (epoch = 1; epoch <= epochs; ++epoch) {
    double loss_sum = 0;
    for (i = (int)n_train - 1; i > 0; --i) {
      int k = (int)(next_random() % (unsigned long long)(i + 1)), t = order[i];
      order[i] = order[k];
      order[k] = t;
    }
    for (step = 0; step < steps; ++step) {
      int64_t x_shape[4], y_shape[1];
      OtTensorView inputs[2];
      OtTensor* outputs[MAX_OUTPUTS] = {NULL};
      const void* loss_data = NULL;
      x_shape[0] = batch, x_shape[1] = 1, x_shape[2] = 8, x_shape[3] = 8;
      y_shape[0] = batch;
      for (j = 0; j < batch; ++j) {
        int src = order[step * batch + j];
        memcpy(batch_x + (size_t)j * PIXELS, x_train + (size_t)src * PIXELS, sizeof(float) * PIXELS);
        batch_y[j] = y_train[src];
      }
      inputs[0].data = batch_x, inputs[0].dtype = OT_DTYPE_FLOAT32, inputs[0].shape = x_shape, inputs[0].rank = 4;
      inputs[1].data = batch_y, inputs[1].dtype = OT_DTYPE_INT64, inputs[1].shape = y_shape, inputs[1].rank = 1;
      CHECK(ot_module_train_step(module, inputs, 2, outputs, n_outputs));
      CHECK(ot_tensor_data(outputs[0], &loss_data)); /* the loss, then any additional outputs */
      loss_sum += *(const float*)loss_data;
      for (j = 0; j < (int)n_outputs; ++j) ot_tensor_release(outputs[j]);
      CHECK(ot_optimizer_step(optimizer));
      CHECK(ot_module_lazy_reset_grad(module));
      CHECK(ot_lr_scheduler_step(scheduler, &lr));
    }
    printf("epoch %2d: train loss %.4f\n", epoch, loss_sum / steps);
  }

  /* Save, export, and check the exported model on the held-out images. */
  path_join(path, sizeof path, out_dir, "checkpoint");
  CHECK(ot_checkpoint_save(checkpoint, path, 1));
  path_join(model_path, sizeof model_path, out_dir, "model.onnx");
  CHECK(ot_module_export_model_for_inferencing(module, model_path, logits_name, 1));
  CHECK(ot_session_create(model_path, &session));
  {
    int64_t x_shape[4];
    const char* input_name = NULL;
    OtTensorView input;
    OtTensor* logits = NULL;
    const void* data = NULL;
    x_shape[0] = (int64_t)n_test, x_shape[1] = 1, x_shape[2] = 8, x_shape[3] = 8;
    CHECK(ot_session_input_name(session, 0, &input_name));
    input.data = x_test, input.dtype = OT_DTYPE_FLOAT32, input.shape = x_shape, input.rank = 4;
    CHECK(ot_session_run(session, &input_name, &input, 1, &logits, 1));
    CHECK(ot_tensor_data(logits, &data));
    for (i = 0; i < (int)n_test; ++i) correct += argmax_row((const float*)data + (size_t)i * CLASSES) == y_test[i];
    ot_tensor_release(logits);
  }
  accuracy = (double)correct / (double)n_test;
  printf("saved %s and %s\ntest accuracy %.4f (%d/%d)\n", path, model_path, accuracy, correct, (int)n_test);

  ot_session_release(session);
  ot_lr_scheduler_release(scheduler);
  ot_optimizer_release(optimizer);
  ot_module_release(module);
  ot_checkpoint_release(checkpoint);
  free(order), free(batch_y), free(batch_x), free(y_test), free(x_test), free(y_train), free(x_train);
  if (accuracy < min_accuracy) {
    fprintf(stderr, "train_digits_c: accuracy %.4f is below the required %.4f\n", accuracy, min_accuracy);
    return 1;
  }
  return 0;
}
