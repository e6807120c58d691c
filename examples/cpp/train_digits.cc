// Train a classifier on-device, in C++ with no Python: load training artifacts and an .npz
// dataset, run the training loop, save a checkpoint, export an inference model and check its
// held-out accuracy.
//
//   train_digits ARTIFACT_DIR DATA.npz OUT_DIR MIN_ACCURACY [--epochs N] [--batch-size B]
//                [--lr LR] [--seed S] [--output NAME]
//
// ARTIFACT_DIR holds what `onnxtrain artifacts --loss cross_entropy` (or Python's
// onnxtrain.artifacts.generate_artifacts) wrote: training_model.onnx, eval_model.onnx,
// optimizer_model.onnx and checkpoint. DATA.npz (np.savez) holds x_train, y_train, x_test and
// y_test: features and class indices. The model's output (--output, default "logits") holds one
// score per class. Prints the mean loss of every epoch, writes OUT_DIR/checkpoint and
// OUT_DIR/model.onnx, and exits with status 1 when the test accuracy is below MIN_ACCURACY.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "onnxtrain/dataset.h"    // load_npz, Dataset, epoch_order
#include "onnxtrain/module.h"     // Module, Optimizer, LinearLRScheduler
#include "onnxtrain/session.h"    // InferenceSession
#include "onnxtrain/training.h"   // CheckpointState

using namespace onnxtrain;

namespace {

struct Options {
  std::string artifacts, data, out, output = "logits";
  double min_accuracy = 0;
  int64_t epochs = 20, batch_size = 32;
  double lr = 0;  // 0: the optimizer model's learning rate
  uint64_t seed = 0;
};

[[noreturn]] void usage(const char* problem) {
  std::fprintf(stderr, "train_digits: %s\nusage: train_digits ARTIFACT_DIR DATA.npz OUT_DIR MIN_ACCURACY "
                       "[--epochs N] [--batch-size B] [--lr LR] [--seed S] [--output NAME]\n", problem);
  std::exit(2);
}

double number(const char* text, const char* what) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (*text == '\0' || *end != '\0') usage((std::string(what) + " must be a number, got '" + text + "'").c_str());
  return v;
}

Options parse(int argc, char** argv) {
  if (argc < 5) usage("missing arguments");
  Options o{argv[1], argv[2], argv[3]};
  o.min_accuracy = number(argv[4], "MIN_ACCURACY");
  for (int i = 5; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("option " + flag + " needs a value").c_str());
    const char* value = argv[i + 1];
    if (flag == "--epochs") o.epochs = int64_t(number(value, "--epochs"));
    else if (flag == "--batch-size") o.batch_size = int64_t(number(value, "--batch-size"));
    else if (flag == "--lr") o.lr = number(value, "--lr");
    else if (flag == "--seed") o.seed = uint64_t(number(value, "--seed"));
    else if (flag == "--output") o.output = value;
    else usage(("unknown option " + flag).c_str());
  }
  if (o.epochs < 1 || o.batch_size < 1) usage("--epochs and --batch-size must be >= 1");
  return o;
}

// Features as float32 and labels as int64 (what the model and CrossEntropy take), one row each.
Dataset load_split(const std::string& path, const std::string& x, const std::string& y) {
  Dataset data(load_npz(path, {x, y}), path);
  data.convert_column(0, DType::kFloat32);
  data.convert_column(1, DType::kInt64);
  return data;
}

int run(const Options& o) {
  Dataset train = load_split(o.data, "x_train", "y_train");
  Dataset test = load_split(o.data, "x_test", "y_test");
  std::printf("%lld training and %lld test examples\n", (long long)train.size(), (long long)test.size());

  // The training objects: parameters and optimizer state live in the CheckpointState.
  const std::filesystem::path dir = o.artifacts;
  CheckpointState state = CheckpointState::load(dir / "checkpoint");
  Module module(dir / "training_model.onnx", state, dir / "eval_model.onnx");
  Optimizer optimizer(dir / "optimizer_model.onnx", module);
  const int64_t batches = train.num_batches(o.batch_size);
  const double lr = o.lr > 0 ? o.lr : optimizer.get_learning_rate();
  // Sets the optimizer's learning rate now and after every optimizer step (ONNX Runtime's semantics).
  LinearLRScheduler schedule(optimizer, /*warmup_step_count=*/batches, /*total_step_count=*/o.epochs * batches, lr);

  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    const std::vector<int64_t> order = epoch_order(train.size(), /*shuffle=*/true, o.seed, epoch);
    double train_loss = 0;
    for (int64_t b = 0; b < batches; ++b) {
      Tensor loss = module.train_step(train.batch(order, b, o.batch_size))[0];  // forward + backward
      optimizer.step();
      module.lazy_reset_grad();  // the next step overwrites the gradients instead of adding
      schedule.step();
      train_loss += loss.item_as_double();
    }
    // Held-out loss through the eval graph (Dropout and BatchNorm in inference mode).
    const std::vector<int64_t> in_order = epoch_order(test.size(), /*shuffle=*/false, 0, 0);
    double test_loss = 0;
    for (int64_t b = 0; b < test.num_batches(256); ++b) {
      std::vector<Tensor> batch = test.batch(in_order, b, 256);
      test_loss += module.eval_step(batch)[0].item_as_double() * double(batch[0].dim(0));
    }
    std::printf("epoch %2lld: train loss %.4f, test loss %.4f\n", (long long)epoch + 1, train_loss / double(batches),
                test_loss / double(test.size()));
  }

  std::filesystem::create_directories(o.out);
  const std::string checkpoint = (std::filesystem::path(o.out) / "checkpoint").string();
  const std::string model = (std::filesystem::path(o.out) / "model.onnx").string();
  state.save(checkpoint, /*include_optimizer_state=*/true);
  module.export_model_for_inferencing(model, {o.output});
  std::printf("saved %s and %s\n", checkpoint.c_str(), model.c_str());

  // The exported model on its own, as an application would run it.
  InferenceSession session(model);
  const Tensor& x = test.columns()[0].value;
  const Tensor& y = test.columns()[1].value;
  Tensor scores = session.run({{session.inputs()[0].name, x}})[0];
  const int64_t classes = scores.dim(1);
  int64_t correct = 0;
  for (int64_t i = 0; i < test.size(); ++i) {
    const float* row = scores.data<float>() + i * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (row[c] > row[best]) best = c;
    correct += best == y.data<int64_t>()[i];
  }
  const double accuracy = double(correct) / double(test.size());
  std::printf("test accuracy %.4f (%lld/%lld)\n", accuracy, (long long)correct, (long long)test.size());
  if (accuracy < o.min_accuracy) {
    std::fprintf(stderr, "train_digits: accuracy %.4f is below the required %.4f\n", accuracy, o.min_accuracy);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const Error& e) {
    std::fprintf(stderr, "train_digits: %s\n", e.what());
    return 1;
  }
}
