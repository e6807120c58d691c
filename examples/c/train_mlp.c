/* Training from plain C with onnxtrain's C API (include/onnxtrain/c_api.h): generate training
 * artifacts from an inference model, train it on points this program makes itself, watch the
 * loss fall and the accuracy rise, save a checkpoint, export the trained inference model and
 * check that model with an inference session.
 *
 *   train_mlp MODEL.onnx OUT_DIR [EPOCHS]
 *
 * MODEL.onnx maps "x" [N, 2] (float) to "logits" [N, 3] with parameters fc1, fc2, fc3 (.weight,
 * .bias); tests/models/make_mlp_classifier.py writes one. The task: which of three rings around
 * the origin a point lies in. The program exits 1 unless training worked: the held-out loss must
 * fall below a quarter of where it started and the exported model must classify 90% of the
 * held-out points. */
#include <math.h>
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

enum { NUM_FEATURES = 2, NUM_CLASSES = 3, NUM_TRAIN = 1024, NUM_TEST = 512, BATCH = 32 };

/* ---- data: points in [-1.5, 1.5]^2, labelled by ring (r < 0.6, r < 1.1, outside) */

static unsigned long long rng_state = 0x9E3779B97F4A7C15ULL;

static double uniform01(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static void make_points(float* x, int64_t* y, int n) {
  int i;
  for (i = 0; i < n; ++i) {
    double a = 3.0 * uniform01() - 1.5, b = 3.0 * uniform01() - 1.5, r = sqrt(a * a + b * b);
    x[2 * i] = (float)a;
    x[2 * i + 1] = (float)b;
    y[i] = r < 0.6 ? 0 : r < 1.1 ? 1 : 2;
  }
}

/* ---- helpers over the API */

static float scalar_of(const OtTensor* t) {
  const void* data = NULL;
  CHECK(ot_tensor_data(t, &data));
  return *(const float*)data;
}

static double accuracy_of(const OtTensor* logits, const int64_t* y, int n) {
  const void* data = NULL;
  const float* z;
  int i, c, correct = 0;
  CHECK(ot_tensor_data(logits, &data));
  z = (const float*)data;
  for (i = 0; i < n; ++i) {
    int best = 0;
    for (c = 1; c < NUM_CLASSES; ++c)
      if (z[i * NUM_CLASSES + c] > z[i * NUM_CLASSES + best]) best = c;
    correct += best == y[i];
  }
  return (double)correct / n;
}

/* Eval graph over the whole held-out set: outputs are the loss and the logits. */
static void evaluate(OtModule* module, const float* x, const int64_t* y, float* loss, double* accuracy) {
  int64_t x_shape[2] = {NUM_TEST, NUM_FEATURES}, y_shape[1] = {NUM_TEST};
  OtTensorView inputs[2];
  OtTensor* outputs[2] = {NULL, NULL};
  inputs[0].data = x, inputs[0].dtype = OT_DTYPE_FLOAT32, inputs[0].shape = x_shape, inputs[0].rank = 2;
  inputs[1].data = y, inputs[1].dtype = OT_DTYPE_INT64, inputs[1].shape = y_shape, inputs[1].rank = 1;
  CHECK(ot_module_eval_step(module, inputs, 2, outputs, 2));
  *loss = scalar_of(outputs[0]);
  *accuracy = accuracy_of(outputs[1], y, NUM_TEST);
  ot_tensor_release(outputs[0]);
  ot_tensor_release(outputs[1]);
}

static void path_join(char* out, size_t size, const char* dir, const char* name) {
  if ((size_t)snprintf(out, size, "%s/%s", dir, name) >= size) {
    fprintf(stderr, "path too long: %s/%s\n", dir, name);
    exit(1);
  }
}

int main(int argc, char** argv) {
  static const char* const trainable[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
  static const char* const logits_name[] = {"logits"};
  static float train_x[NUM_TRAIN * NUM_FEATURES], test_x[NUM_TEST * NUM_FEATURES], batch_x[BATCH * NUM_FEATURES];
  static int64_t train_y[NUM_TRAIN], test_y[NUM_TEST], batch_y[BATCH];
  static int order[NUM_TRAIN];
  const char *model_path, *out_dir;
  char training_path[1024], eval_path[1024], optimizer_path[1024], checkpoint_path[1024], trained_path[1024],
      inference_path[1024];
  int epochs, epoch, i, j, steps_per_epoch = NUM_TRAIN / BATCH;
  size_t n;
  float initial_loss, test_loss = 0;
  double test_accuracy = 0, lr = 0, exported_accuracy;
  OtArtifactOptions* options = NULL;
  OtCheckpoint* checkpoint = NULL;
  OtModule* module = NULL;
  OtOptimizer* optimizer = NULL;
  OtLRScheduler* scheduler = NULL;
  OtInferenceSession* session = NULL;

  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: %s MODEL.onnx OUT_DIR [EPOCHS]\n", argv[0]);
    return 2;
  }
  model_path = argv[1];
  out_dir = argv[2];
  epochs = argc == 4 ? atoi(argv[3]) : 30;
  if (epochs < 1) {
    fprintf(stderr, "EPOCHS must be at least 1\n");
    return 2;
  }

  /* 1. Artifacts: training, eval and optimizer graphs plus a checkpoint, from the inference model.
   * The logits are an additional output, so eval steps give the accuracy too. */
  CHECK(ot_artifact_options_create(&options));
  CHECK(ot_artifact_options_set_requires_grad(options, trainable, sizeof trainable / sizeof *trainable));
  CHECK(ot_artifact_options_set_loss(options, OT_LOSS_CROSS_ENTROPY));
  CHECK(ot_artifact_options_set_optimizer(options, OT_OPTIMIZER_ADAMW, 1e-2));
  CHECK(ot_artifact_options_set_additional_output_names(options, logits_name, 1));
  CHECK(ot_generate_artifacts(model_path, options, out_dir));
  ot_artifact_options_release(options);
  path_join(training_path, sizeof training_path, out_dir, "training_model.onnx");
  path_join(eval_path, sizeof eval_path, out_dir, "eval_model.onnx");
  path_join(optimizer_path, sizeof optimizer_path, out_dir, "optimizer_model.onnx");
  path_join(checkpoint_path, sizeof checkpoint_path, out_dir, "checkpoint");
  path_join(trained_path, sizeof trained_path, out_dir, "trained_checkpoint");
  path_join(inference_path, sizeof inference_path, out_dir, "trained_model.onnx");

  /* 2. The training objects. The scheduler warms the learning rate up over the first epoch, then
   * decays it linearly to 0 at the last step. */
  CHECK(ot_checkpoint_load(checkpoint_path, &checkpoint));
  CHECK(ot_module_create(training_path, checkpoint, eval_path, &module));
  CHECK(ot_optimizer_create(optimizer_path, module, &optimizer));
  CHECK(ot_lr_scheduler_create_linear(optimizer, steps_per_epoch, (int64_t)epochs * steps_per_epoch, 1e-2, &scheduler));
  CHECK(ot_module_input_count(module, &n));
  printf("training inputs:");
  for (i = 0; i < (int)n; ++i) {
    const char* name = NULL;
    CHECK(ot_module_input_name(module, (size_t)i, &name));
    printf(" %s", name);
  }
  CHECK(ot_module_output_count(module, &n));
  printf(", outputs: %d (loss, logits)\n", (int)n);
  if (n != 2) return 1;

  /* 3. Data, and the held-out loss before training. */
  make_points(train_x, train_y, NUM_TRAIN);
  make_points(test_x, test_y, NUM_TEST);
  for (i = 0; i < NUM_TRAIN; ++i) order[i] = i;
  evaluate(module, test_x, test_y, &initial_loss, &test_accuracy);
  printf("before training: held-out loss %.4f, accuracy %.1f%%\n", initial_loss, 100 * test_accuracy);

  /* 4. The loop: train step (forward, backward), optimizer step, reset gradients, schedule. */
  for (epoch = 1; epoch <= epochs; ++epoch) {
    double loss_sum = 0;
    int step;
    for (i = NUM_TRAIN - 1; i > 0; --i) { /* shuffle */
      int k = (int)(uniform01() * (i + 1)), t = order[i];
      order[i] = order[k];
      order[k] = t;
    }
    for (step = 0; step < steps_per_epoch; ++step) {
      int64_t x_shape[2] = {BATCH, NUM_FEATURES}, y_shape[1] = {BATCH};
      OtTensorView inputs[2];
      OtTensor* outputs[2] = {NULL, NULL};
      for (j = 0; j < BATCH; ++j) {
        int src = order[step * BATCH + j];
        batch_x[2 * j] = train_x[2 * src];
        batch_x[2 * j + 1] = train_x[2 * src + 1];
        batch_y[j] = train_y[src];
      }
      inputs[0].data = batch_x, inputs[0].dtype = OT_DTYPE_FLOAT32, inputs[0].shape = x_shape, inputs[0].rank = 2;
      inputs[1].data = batch_y, inputs[1].dtype = OT_DTYPE_INT64, inputs[1].shape = y_shape, inputs[1].rank = 1;
      CHECK(ot_module_train_step(module, inputs, 2, outputs, 2));
      loss_sum += scalar_of(outputs[0]);
      ot_tensor_release(outputs[0]);
      ot_tensor_release(outputs[1]);
      CHECK(ot_optimizer_step(optimizer));
      CHECK(ot_module_lazy_reset_grad(module));
      CHECK(ot_lr_scheduler_step(scheduler, &lr));
    }
    evaluate(module, test_x, test_y, &test_loss, &test_accuracy);
    if (epoch == 1 || epoch % 5 == 0 || epoch == epochs)
      printf("epoch %3d  train loss %.4f  held-out loss %.4f  accuracy %5.1f%%  lr %.5f\n", epoch,
             loss_sum / steps_per_epoch, test_loss, 100 * test_accuracy, lr);
  }

  /* 5. Save the trained state (with the optimizer's moments, to resume) and a note of the run. */
  CHECK(ot_checkpoint_set_int_property(checkpoint, "epochs", epochs));
  CHECK(ot_checkpoint_set_float_property(checkpoint, "held_out_accuracy", test_accuracy));
  CHECK(ot_checkpoint_save(checkpoint, trained_path, 1));

  /* 6. Export the inference model (parameters baked in, loss and targets gone) and check it. */
  CHECK(ot_module_export_model_for_inferencing(module, inference_path, logits_name, 1));
  CHECK(ot_session_create(inference_path, &session));
  {
    int64_t x_shape[2] = {NUM_TEST, NUM_FEATURES};
    const char* input_names[1] = {"x"};
    OtTensorView input;
    OtTensor* logits = NULL;
    input.data = test_x, input.dtype = OT_DTYPE_FLOAT32, input.shape = x_shape, input.rank = 2;
    CHECK(ot_session_run(session, input_names, &input, 1, &logits, 1));
    exported_accuracy = accuracy_of(logits, test_y, NUM_TEST);
    ot_tensor_release(logits);
  }
  printf("saved %s; exported %s: accuracy %.1f%% on %d held-out points\n", trained_path, inference_path,
         100 * exported_accuracy, NUM_TEST);

  ot_session_release(session);
  ot_lr_scheduler_release(scheduler);
  ot_optimizer_release(optimizer);
  ot_module_release(module);
  ot_checkpoint_release(checkpoint);

  if (!(test_loss < 0.25f * initial_loss) || exported_accuracy < 0.9) {
    fprintf(stderr, "training did not work: held-out loss %.4f -> %.4f, exported accuracy %.1f%%\n", initial_loss,
            test_loss, 100 * exported_accuracy);
    return 1;
  }
  printf("ok: held-out loss %.4f -> %.4f\n", initial_loss, test_loss);
  return 0;
}
