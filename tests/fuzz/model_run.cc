// Fuzzed models run: the bytes as an ONNX model through InferenceSession (optimisation passes,
// shape rules, memory planning, kernels) on small inputs, then through build_training_graphs and
// one Module::train_step with an MSE loss on the first output (floating-point inputs turned into
// trained initializers), so kernels, shape rules and gradient rules meet hostile shapes and
// attributes. Inputs are the declared shapes with every
// unknown dim 2; a model asking for more than kMaxInputElements per input is skipped. The limits
// of fuzz_util.h cap tensor memory and Loop iterations; libFuzzer's -timeout caps the time.
#include <map>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "onnx/model_io.h"
#include "onnxtrain/module.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
#include "training/artifacts.h"

namespace {

constexpr int64_t kMaxInputElements = 4096;

// A small deterministic tensor of the declared dtype and shape: values in [-1.5, 1.5] for floats,
// 0..2 for integers, alternating for bool.
bool make_input(const onnxtrain::IoInfo& info, onnxtrain::Tensor* out) {
  using namespace onnxtrain;
  if (info.sequence || info.optional || !dtype_supported(info.dtype)) return false;
  Shape shape;
  if (info.rank_known) {
    for (int64_t d : info.shape) shape.push_back(d < 0 ? 2 : d);
  } else {
    shape = {2};
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d > kMaxInputElements) return false;
    n *= d;
    if (n > kMaxInputElements) return false;
  }
  Tensor t = Tensor::zeros(info.dtype, shape);
  for (int64_t i = 0; i < n; ++i) {
    const double v = is_floating(info.dtype) ? double(i % 7) * 0.5 - 1.5 : double(i % (info.dtype == DType::kBool ? 2 : 3));
    switch (info.dtype) {
      case DType::kFloat32: t.data<float>()[i] = float(v); break;
      case DType::kFloat64: t.data<double>()[i] = v; break;
      case DType::kFloat16: t.data<float16>()[i] = float16(float(v)); break;
      case DType::kBFloat16: t.data<bfloat16>()[i] = bfloat16(float(v)); break;
      case DType::kBool: t.data<bool>()[i] = v != 0; break;
      case DType::kInt8: t.data<int8_t>()[i] = int8_t(v); break;
      case DType::kUint8: t.data<uint8_t>()[i] = uint8_t(v); break;
      case DType::kInt16: t.data<int16_t>()[i] = int16_t(v); break;
      case DType::kUint16: t.data<uint16_t>()[i] = uint16_t(v); break;
      case DType::kInt32: t.data<int32_t>()[i] = int32_t(v); break;
      case DType::kUint32: t.data<uint32_t>()[i] = uint32_t(v); break;
      case DType::kInt64: t.data<int64_t>()[i] = int64_t(v); break;
      case DType::kUint64: t.data<uint64_t>()[i] = uint64_t(v); break;
      default: return false;
    }
  }
  *out = t;
  return true;
}

}  // namespace

FUZZ_INITIALIZE_WITH_LIMITS()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::map<std::string, Tensor> feeds;
  std::vector<Tensor> outputs;
  try {
    SessionOptions options;
    options.num_threads = 1;
    InferenceSession session = InferenceSession::from_bytes(bytes, options);
    for (const IoInfo& in : session.inputs())
      if (!make_input(in, &feeds[in.name])) return 0;
    outputs = session.run(feeds);
  } catch (const Error& e) {
    fuzz::refused(e);
    return 0;
  }
  if (outputs.empty() || !is_floating(outputs[0].dtype())) return 0;
  try {
    Model model = load_model_from_bytes(bytes, fuzz::scratch_dir(), "<fuzz>");
    // Most small models (the conformance run's among them) take their weights as inputs: the
    // floating-point inputs become initializers holding the values fed above, and get trained.
    for (auto in = model.graph.inputs.begin(); in != model.graph.inputs.end();) {
      const Tensor& fed = feeds.at(in->name);
      if (!is_floating(fed.dtype()) || fed.numel() == 0) {
        ++in;
        continue;
      }
      model.graph.initializers[in->name] = fed.clone();
      in = model.graph.inputs.erase(in);
    }
    TrainingGraphOptions o;
    o.loss = LossType::kMSE;
    o.requires_grad = all_parameters(model);
    if (o.requires_grad.empty()) return 0;
    Model source = promote_constant_parameters(model, o.requires_grad);
    TrainingGraphs graphs = build_training_graphs(source, o);
    Graph params;
    for (const auto& name : graphs.trainable) params.initializers[name] = source.graph.initializers.at(name);
    for (const auto& name : graphs.frozen) params.initializers[name] = source.graph.initializers.at(name);
    CheckpointState state = CheckpointState::from_initializers(params, graphs.trainable);
    std::vector<Tensor> inputs;
    for (const std::string& name : graphs.user_inputs) {
      auto it = feeds.find(name);
      inputs.push_back(it != feeds.end() ? it->second : Tensor::zeros(outputs[0].dtype(), outputs[0].shape()));
    }
    Module module(std::move(graphs.training), state, std::move(graphs.eval));
    module.train_step(inputs);
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}
