// Every CUDA kernel against the CPU kernel of its op, forward and gradient ops alike: each case
// is one node run by a CPU executor and by a CUDA executor on the same fresh random inputs, and
// every output must agree (float32 within 1e-5 relative in norm, half types within their
// rounding; integers exactly). A hand-written MLP training step (forward, backward, AdamW) then
// runs 20 steps on both devices and must follow the same loss curve. On a machine without a GPU
// every test skips, naming the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "../cpp/test_util.h"
#include "core/device.h"
#include "runtime/executor.h"

namespace onnxtrain {
using test::error_of;
using test::make_node;
using test::value;

namespace {

#define SKIP_WITHOUT_CUDA()                                                  \
  do {                                                                       \
    std::string why;                                                         \
    if (!device_available(Device::kCuda, &why)) GTEST_SKIP() << why;         \
  } while (0)

Tensor random(DType dt, const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(size_t(numel(shape)));
  for (float& x : v) x = u(rng);
  switch (dt) {
    case DType::kFloat16: {
      std::vector<float16> h(v.begin(), v.end());
      return Tensor::from_vector(h, shape);
    }
    case DType::kBFloat16: {
      std::vector<bfloat16> h(v.begin(), v.end());
      return Tensor::from_vector(h, shape);
    }
    case DType::kFloat64: {
      std::vector<double> h(v.begin(), v.end());
      return Tensor::from_vector(h, shape);
    }
    case DType::kInt64: {
      std::vector<int64_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = int64_t(std::lround(v[i]));
      return Tensor::from_vector(h, shape);
    }
    default: return Tensor::from_vector(v, shape);
  }
}
Tensor labels(const Shape& shape, int64_t classes, std::mt19937& rng) {
  std::vector<int64_t> v(size_t(numel(shape)));
  for (int64_t& x : v) x = int64_t(rng() % uint32_t(classes));
  return Tensor::from_vector(v, shape);
}
Tensor ints(const std::vector<int64_t>& v) { return Tensor::from_vector(v, {int64_t(v.size())}); }

double tolerance(DType dt) {
  switch (dt) {
    case DType::kFloat16: return 2e-3;
    case DType::kBFloat16: return 1e-2;
    default: return 1e-5;
  }
}

// ‖got - want‖ / ‖want‖ over the finite elements of floating outputs (NaN where either has a NaN
// or an infinity the other lacks), the count of differing elements for the others.
double difference(const Tensor& got, const Tensor& want) {
  if (!is_floating(want.dtype())) {
    double differ = 0;
    for (int64_t i = 0; i < want.numel(); ++i) differ += got.item_as_int(i) != want.item_as_int(i);
    return differ;
  }
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.item_as_double(i), w = want.item_as_double(i);
    if (std::isnan(g) != std::isnan(w)) return NAN;
    if (std::isnan(w)) continue;
    if (std::isinf(g) || std::isinf(w)) {  // an infinity must be met by the same one (log-softmax's masked -inf)
      if (g != w) return NAN;
      continue;
    }
    num += (g - w) * (g - w);
    den += w * w;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct Case {
  Node node;
  std::vector<Tensor> inputs;  // an undefined tensor: the input is omitted
  int64_t opset = 17;
};

Model one_node_model(Case& c) {
  Graph g;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].defined()) {
      c.node.inputs.push_back("");
      continue;
    }
    const std::string name = "in" + std::to_string(i);
    c.node.inputs.push_back(name);
    g.inputs.push_back(value(name, c.inputs[i].dtype(), c.inputs[i].shape()));
  }
  for (const auto& out : c.node.outputs)
    if (!out.empty()) g.outputs.push_back(value(out, DType::kUndefined, std::nullopt));
  g.nodes = {c.node};
  Model m = test::make_model(std::move(g), c.opset);
  m.opsets[kOnnxTrainDomain] = 1;
  m.opsets[kMsDomain] = 1;
  return m;
}

std::map<std::string, Tensor> feeds_of(const Case& c) {
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.inputs[i].defined()) feeds["in" + std::to_string(i)] = c.inputs[i];
  return feeds;
}

// Runs the case on both devices (twice on the GPU: the recording run and a planned run) and
// compares every output; `tol` 0: by the dtype of each output.
void expect_same_on_cuda(Case c, double tol = 0) {
  SCOPED_TRACE(c.node.op_type + " node '" + c.node.name + "'");
  Model model = one_node_model(c);
  const auto feeds = feeds_of(c);
  Executor cpu(model);
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor gpu(model, options);
  const std::vector<Tensor> want = cpu.run(feeds);
  for (int run = 0; run < 2; ++run) {
    const std::vector<Tensor> got = gpu.run(feeds);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].dtype(), want[i].dtype()) << "output " << i;
      ASSERT_EQ(got[i].shape(), want[i].shape()) << "output " << i;
      const double t = tol ? tol : tolerance(want[i].dtype());
      const double d = difference(got[i], want[i]);
      EXPECT_TRUE(d <= (is_floating(want[i].dtype()) ? t : 0.0))
          << "output " << i << " (" << dtype_name(want[i].dtype()) << " " << shape_str(want[i].shape())
          << ") differs by " << d << " (tolerance " << t << "), run " << run;
    }
  }
}

Node node(std::string op, size_t outputs, std::map<std::string, Attribute> attrs = {}, std::string domain = "") {
  std::vector<std::string> outs;
  for (size_t i = 0; i < outputs; ++i) outs.push_back("out" + std::to_string(i));
  Node n = make_node(std::move(op), {}, outs);
  n.attributes = std::move(attrs);
  n.domain = std::move(domain);
  return n;
}
Attribute I(int64_t v) { return Attribute::of(v); }
Attribute F(float v) { return Attribute::of(v); }

const DType kFloatTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

}  // namespace

TEST(CudaKernels, MatMulAgreesWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(1);
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{64, 48}, {48, 40}}, {{2, 3, 33, 17}, {17, 29}}, {{2, 5, 7}, {2, 7, 9}}, {{2, 1, 4, 5}, {1, 3, 5, 6}},
      {{7}, {7, 5}}, {{4, 7}, {7}}, {{6, 7}, {3, 7, 5}}, {{3, 0}, {0, 4}},
      // Strided batches whose matrices after the first are less aligned than the first (odd
      // strides): cuBLASLt must not be told the first's alignment holds for all.
      {{4, 33, 65}, {4, 65, 31}}, {{3, 64, 63}, {3, 63, 64}}};
  for (DType dt : kFloatTypes)
    for (const auto& [a, b] : shapes)
      expect_same_on_cuda({node("MatMul", 1), {random(dt, a, rng), random(dt, b, rng)}});
}

TEST(CudaKernels, GemmAndFusedMatMulAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(2);
  for (DType dt : kFloatTypes) {
    expect_same_on_cuda({node("Gemm", 1, {{"transB", I(1)}}), {random(dt, {16, 32}, rng), random(dt, {24, 32}, rng),
                                                             random(dt, {24}, rng)}});
    expect_same_on_cuda({node("Gemm", 1, {{"transA", I(1)}, {"alpha", F(0.5f)}, {"beta", F(2.0f)}}),
                         {random(dt, {32, 16}, rng), random(dt, {32, 24}, rng), random(dt, {16, 1}, rng)}});
    expect_same_on_cuda({node("Gemm", 1, {{"beta", F(0.25f)}}),
                         {random(dt, {8, 5}, rng), random(dt, {5, 3}, rng), random(dt, {8, 3}, rng)}});
    expect_same_on_cuda({node("FusedMatMul", 1, {{"transA", I(1)}, {"alpha", F(0.5f)}}, kOnnxTrainDomain),
                         {random(dt, {3, 20, 12}, rng), random(dt, {20, 9}, rng), random(dt, {9}, rng)}});
    expect_same_on_cuda({node("FusedMatMul", 1, {{"transB", I(1)}}, kMsDomain),
                         {random(dt, {2, 6, 8}, rng), random(dt, {2, 5, 8}, rng)}});
  }
}

TEST(CudaKernels, BroadcastingElementwiseAgreesWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(3);
  // The last line: rows of at least 128 elements, a block a row (inner stride 1 or 0 in either input).
  const std::vector<std::pair<Shape, Shape>> shapes = {{{4, 33}, {4, 33}}, {{2, 3, 5}, {5}}, {{2, 1, 5}, {3, 1}},
                                                       {{1}, {6, 7}},     {{}, {3}},        {{0, 3}, {3}},
                                                       {{3, 200}, {200}}, {{5, 1}, {5, 300}}, {{2, 3, 160}, {3, 1}}};
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    for (DType dt : kFloatTypes)
      for (const auto& [a, b] : shapes) expect_same_on_cuda({node(op, 1), {random(dt, a, rng), random(dt, b, rng, 0.5f, 2.0f)}});
    expect_same_on_cuda({node(op, 1), {random(DType::kInt64, {3, 4}, rng, -9, 9), random(DType::kInt64, {4}, rng, -3, 3)}});
  }
  for (const char* op : {"Relu", "Neg", "Abs", "Exp", "Tanh", "Sigmoid"})
    for (DType dt : kFloatTypes) expect_same_on_cuda({node(op, 1), {random(dt, {3, 50}, rng, -3, 3)}});
  for (const char* op : {"Log", "Sqrt", "Reciprocal"})
    for (DType dt : kFloatTypes) expect_same_on_cuda({node(op, 1), {random(dt, {3, 50}, rng, 0.1f, 4.0f)}});
  expect_same_on_cuda({node("Relu", 1), {random(DType::kInt64, {40}, rng, -5, 5)}});
  for (DType dt : kFloatTypes)
    expect_same_on_cuda({node("ReluGrad", 1, {}, kOnnxTrainDomain), {random(dt, {4, 9}, rng), random(dt, {4, 9}, rng)}});
  // A dtype outside the family runs on the host, with the same result.
  expect_same_on_cuda({node("Add", 1), {random(DType::kFloat64, {3}, rng), random(DType::kFloat64, {3}, rng)}});
}

TEST(CudaKernels, ReductionsAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(4);
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{8, 300}, {1}}, {{8, 300}, {0}}, {{4, 5, 6}, {1}}, {{4, 5, 6}, {0, 1}}, {{4, 5, 6}, {-1}}, {{4, 1, 6}, {0, 2}}, {{4, 5, 6}, {0, 2}}};
  for (const char* op : {"ReduceSum", "ReduceMean"})
    for (DType dt : kFloatTypes)
      for (const auto& [shape, axes] : cases)
        for (int64_t keep : {0, 1}) {
          Tensor x = random(dt, shape, rng);
          expect_same_on_cuda({node(op, 1, {{"keepdims", I(keep)}}), {x, ints(axes)}, 18});
        }
}

TEST(CudaKernels, SoftmaxForwardAndBackwardAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  for (DType dt : kFloatTypes) {
    for (const char* op : {"Softmax", "LogSoftmax"}) {
      expect_same_on_cuda({node(op, 1), {random(dt, {6, 1000}, rng, -5, 5)}});
      // Odd lines (each starts at another alignment: the packed loads' head and tail) several
      // packs a thread long.
      expect_same_on_cuda({node(op, 1), {random(dt, {5, 4099}, rng, -5, 5)}});
      expect_same_on_cuda({node(op, 1, {{"axis", I(1)}}), {random(dt, {3, 7, 5}, rng, -5, 5)}});
      expect_same_on_cuda({node(op, 1, {{"axis", I(1)}}), {random(dt, {3, 7, 5}, rng, -5, 5)}, 11});  // 2-D coercion
    }
    for (const char* op : {"SoftmaxGrad", "LogSoftmaxGrad"}) {
      expect_same_on_cuda({node(op, 1, {{"axis", I(-1)}}, kOnnxTrainDomain), {random(dt, {5, 70}, rng), random(dt, {5, 70}, rng, -2, 0)}});
      expect_same_on_cuda({node(op, 1, {{"axis", I(1)}, {"coerce_2d", I(1)}}, kOnnxTrainDomain),
                           {random(dt, {2, 3, 4}, rng), random(dt, {2, 3, 4}, rng, -2, 0)}});
    }
    expect_same_on_cuda({node("SoftmaxGrad_13", 1, {{"axis", I(0)}}, kMsDomain), {random(dt, {9, 4}, rng), random(dt, {9, 4}, rng)}});
  }
  // Masked positions (-inf), leading a line and inside it: the online max and sum skip them.
  Tensor masked = random(DType::kFloat32, {4, 700}, rng, -5, 5);
  for (int64_t i = 0; i < masked.numel(); ++i)
    if (i % 700 < 300 || i % 7 == 0) masked.data<float>()[i] = -std::numeric_limits<float>::infinity();
  for (const char* op : {"Softmax", "LogSoftmax"}) expect_same_on_cuda({node(op, 1), {masked}});
}

TEST(CudaKernels, LayerNormForwardAndBackwardAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(6);
  // Rows a warp each (768 in 16-byte packs, 9 element by element) and a block each (over 4096
  // elements: 4608 in packs, 4099 not).
  for (DType dt : kFloatTypes) {
    for (const Shape& shape : {Shape{4, 6, 768}, Shape{3, 9}, Shape{2, 4608}, Shape{2, 4099}}) {
      const Shape params{shape.back()};
      Tensor x = random(dt, shape, rng, -3, 3), s = random(dt, params, rng), b = random(dt, params, rng);
      expect_same_on_cuda({node("LayerNormalization", 3), {x, s, b}});
      // The gradient, from the forward's statistics and recomputing them.
      Case fwd{node("LayerNormalization", 3), {x, s, b}};
      Model m = one_node_model(fwd);
      const auto stats = Executor(m).run(feeds_of(fwd));
      Tensor dy = random(dt, x.shape(), rng);
      expect_same_on_cuda({node("LayerNormalizationGrad", 3, {}, kOnnxTrainDomain), {dy, x, s, stats[1], stats[2]}});
      expect_same_on_cuda({node("LayerNormalizationGrad", 3, {}, kMsDomain), {dy, x, s}});
    }
    expect_same_on_cuda({node("LayerNormalization", 1, {{"axis", I(1)}, {"epsilon", F(1e-3f)}}),
                         {random(dt, {5, 3, 4}, rng), random(dt, {3, 4}, rng)}});
  }
}

TEST(CudaKernels, SoftmaxCrossEntropyAndItsGradientAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  for (DType dt : kFloatTypes)
    for (const char* reduction : {"mean", "sum", "none"})
      for (bool ignore : {false, true}) {
        std::map<std::string, Attribute> attrs{{"reduction", Attribute::of(std::string(reduction))}};
        if (ignore) attrs["ignore_index"] = I(2);
        for (const Shape& shape : {Shape{16, 50}, Shape{4, 7, 3}}) {
          Tensor x = random(dt, shape, rng, -4, 4);
          Shape lshape = shape;
          lshape.erase(lshape.begin() + 1);
          Tensor t = labels(lshape, shape[1], rng);
          expect_same_on_cuda({node("SoftmaxCrossEntropyLoss", 2, attrs), {x, t}}, dt == DType::kFloat32 ? 1e-5 : 0);
          Case fwd{node("SoftmaxCrossEntropyLoss", 2, attrs), {x, t}};
          Model m = one_node_model(fwd);
          const auto out = Executor(m).run(feeds_of(fwd));
          Tensor dloss = random(dt, out[0].shape(), rng);
          expect_same_on_cuda({node("SoftmaxCrossEntropyLossGrad", 1, attrs, kOnnxTrainDomain), {dloss, out[1], t}});
          auto from_scores = attrs;
          from_scores["from_scores"] = I(1);
          expect_same_on_cuda({node("SoftmaxCrossEntropyLossGrad", 1, from_scores, kOnnxTrainDomain), {dloss, x, t}});
        }
      }
  // Class weights run on the host, with the same result.
  expect_same_on_cuda({node("SoftmaxCrossEntropyLoss", 1), {random(DType::kFloat32, {6, 4}, rng), labels({6}, 4, rng),
                                                            random(DType::kFloat32, {4}, rng, 0.5f, 1.5f)}});
}

TEST(CudaKernels, AnOutOfRangeLabelIsAnErrorOnTheGpuToo) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(8);
  Case c{node("SoftmaxCrossEntropyLoss", 1), {random(DType::kFloat32, {3, 4}, rng), ints({0, 7, 1})}};
  Model m = one_node_model(c);
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor gpu(m, options);
  EXPECT_NE(error_of([&] { gpu.run(feeds_of(c)); }).find("out of range [0, 4)"), std::string::npos);
}

// Copies must agree bit for bit: a tolerance below every nonzero difference.
constexpr double kExact = std::numeric_limits<double>::min();

// The copy kernel's paths: a contiguous whole (cudaMemcpyAsync), 16-, 8- and 4-byte units
// (float32 rows of 64 and 1024, float16 of 4), element by element (odd rows: 5, 129), a block per
// row (rows of at least 128 units), the inner dim moving (read at a stride), size-1 dims and
// empty tensors; every element size (bool 1, float16 2, float32 4, int64 8).
TEST(CudaKernels, TransposeAgreesWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(15);
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{2, 16, 4, 64}, {0, 2, 1, 3}},  // attention's [B, S, H, D] -> [B, H, S, D]
      {{2, 3, 2, 1024}, {0, 2, 1, 3}}, {{2, 3, 2, 129}, {0, 2, 1, 3}}, {{2, 3, 4, 5}, {0, 2, 1, 3}},
      {{2, 4, 3, 8}, {0, 2, 3, 1}},    // the key transpose [B, H, S, D] -> [B, H, D, S]
      {{33, 65}, {1, 0}},              {{3, 1, 4}, {2, 1, 0}}, {{3, 4, 5}, {-1, 0, -2}},
      {{4, 5}, {0, 1}},                {{0, 3}, {1, 0}},       {{7}, {0}}, {{2, 3, 2, 3, 2, 3, 2, 3}, {7, 6, 5, 4, 3, 2, 1, 0}}};
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64})
    for (const auto& [shape, perm] : cases)
      expect_same_on_cuda({node("Transpose", 1, {{"perm", Attribute::of(perm)}}), {random(dt, shape, rng, -9, 9)}},
                          kExact);
  expect_same_on_cuda({node("Transpose", 1), {random(DType::kFloat32, {3, 4, 5}, rng)}}, kExact);  // reversed
  Tensor flags = Tensor::empty(DType::kBool, {6, 7});
  for (int64_t i = 0; i < flags.numel(); ++i) flags.data<bool>()[i] = rng() % 2;
  expect_same_on_cuda({node("Transpose", 1, {{"perm", Attribute::of(std::vector<int64_t>{1, 0})}}), {flags}}, kExact);
}

// Views on the device: the output shares the input's device storage, and the shape or axes input
// stays on the host.
TEST(CudaKernels, ViewOpsAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(16);
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64}) {
    Tensor x = random(dt, {2, 3, 4}, rng, -9, 9);
    expect_same_on_cuda({node("Reshape", 1), {x, ints({4, -1})}}, kExact);
    expect_same_on_cuda({node("Reshape", 1), {x, ints({0, -1})}}, kExact);
    expect_same_on_cuda({node("Flatten", 1, {{"axis", I(2)}}), {x}}, kExact);
    expect_same_on_cuda({node("Flatten", 1, {{"axis", I(-3)}}), {x}}, kExact);
    expect_same_on_cuda({node("Unsqueeze", 1), {x, ints({0, -1})}}, kExact);
    expect_same_on_cuda({node("Squeeze", 1), {random(dt, {3, 1, 4, 1}, rng, -9, 9), ints({-1, 1})}}, kExact);
    expect_same_on_cuda({node("Squeeze", 1), {random(dt, {1, 5, 1}, rng, -9, 9)}}, kExact);
    expect_same_on_cuda({node("Identity", 1), {x}}, kExact);
    expect_same_on_cuda({node("Reshape", 1), {random(dt, {0, 3}, rng), ints({3, -1})}}, kExact);
  }
  // x -> Relu -> Reshape -> Transpose -> Relu: the view aliases Relu's device output, the shape
  // stays a host constant, so the only copy in is x's.
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{4, 6})};
  g.initializers["shape"] = ints({3, 8});
  g.nodes = {make_node("Relu", {"x"}, {"r"}), make_node("Reshape", {"r", "shape"}, {"v"}),
             make_node("Transpose", {"v"}, {"t"}), make_node("Relu", {"t"}, {"y"})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  Model m = test::make_model(std::move(g), 17);
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor cpu(m), gpu(m, options);
  const std::map<std::string, Tensor> feeds{{"x", random(DType::kFloat32, {4, 6}, rng)}};
  for (int run = 0; run < 2; ++run) {
    EXPECT_EQ(difference(to_device(gpu.run(feeds)[0], Device::kCpu), cpu.run(feeds)[0]), 0.0) << "run " << run;
    EXPECT_EQ(gpu.memory_report().device_copies, 1u) << "run " << run;
    EXPECT_EQ(gpu.memory_report().views, 1u) << "run " << run;
  }
}

TEST(CudaKernels, ExpandAndConcatAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(17);
  const std::vector<std::pair<Shape, Shape>> expands = {{{3, 1}, {2, 3, 5}}, {{1}, {4, 4}},   {{5}, {2, 5}},
                                                        {{2, 1, 130}, {2, 3, 130}}, {{1, 64}, {8, 64}}, {{3, 1}, {0, 3, 4}},
                                                        {{4, 5}, {1, 1}},     {{}, {3}}};
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64})
    for (const auto& [in, shape] : expands)
      expect_same_on_cuda({node("Expand", 1), {random(dt, in, rng, -9, 9), ints(shape)}}, kExact);
  const std::vector<std::pair<std::vector<Shape>, int64_t>> concats = {
      {{{2, 64}, {2, 128}}, 1}, {{{2, 3}, {2, 5}}, 1},          {{{2, 3}, {4, 3}, {1, 3}}, 0},
      {{{2, 3, 4}, {2, 1, 4}}, -2}, {{{2, 0}, {2, 3}}, -1},     {{{3, 2, 130}, {3, 2, 7}}, 2}};
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64})
    for (const auto& [shapes, axis] : concats) {
      Case c{node("Concat", 1, {{"axis", I(axis)}}), {}};
      for (const Shape& s : shapes) c.inputs.push_back(random(dt, s, rng, -9, 9));
      expect_same_on_cuda(c, kExact);
    }
  // A shape computation's concat of int64 dims.
  expect_same_on_cuda({node("Concat", 1, {{"axis", I(0)}}), {ints({2}), ints({-1}), ints({4, 64})}}, kExact);
}

// Slice's views: steps, a reversal (negative strides), negative axes, clamped ends, an empty
// slice, and aligned wide rows (16-byte units); SliceGrad writes dY into zeros at the same views.
TEST(CudaKernels, SliceAndSliceGradAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(18);
  const int64_t kEnd = std::numeric_limits<int64_t>::max();
  struct SliceCase {
    Shape shape;
    std::vector<int64_t> starts, ends, axes, steps;
  };
  const std::vector<SliceCase> cases = {
      {{10, 20}, {2, 1}, {8, 19}, {0, 1}, {1, 3}},  {{10, 20}, {-1}, {-kEnd}, {1}, {-1}},
      {{4, 6, 8}, {1}, {kEnd}, {-2}, {2}},          {{4, 1024}, {256}, {768}, {1}, {1}},
      {{4, 6}, {3}, {3}, {0}, {1}},                 {{3, 5, 7}, {6, 0}, {0, 4}, {2, 1}, {-2, 1}},
      {{2, 16, 4, 64}, {0, 32}, {2, 64}, {0, 3}, {1, 1}}};
  for (DType dt : kFloatTypes)
    for (const SliceCase& sc : cases) {
      Tensor x = random(dt, sc.shape, rng);
      expect_same_on_cuda({node("Slice", 1), {x, ints(sc.starts), ints(sc.ends), ints(sc.axes), ints(sc.steps)}}, kExact);
      Case fwd{node("Slice", 1), {x, ints(sc.starts), ints(sc.ends), ints(sc.axes), ints(sc.steps)}};
      Model m = one_node_model(fwd);
      const Tensor y = Executor(m).run(feeds_of(fwd))[0];
      const Tensor dy = random(dt, y.shape(), rng);
      for (const std::string& domain : {kOnnxTrainDomain, kMsDomain})
        expect_same_on_cuda({node("SliceGrad", 1, {}, domain),
                             {dy, ints(sc.shape), ints(sc.starts), ints(sc.ends), ints(sc.axes), ints(sc.steps)}},
                            kExact);
    }
  expect_same_on_cuda({node("Slice", 1), {random(DType::kInt64, {5, 3}, rng, -9, 9), ints({1}), ints({4})}}, kExact);
  expect_same_on_cuda({node("SliceGrad", 1, {}, kOnnxTrainDomain),
                       {random(DType::kFloat32, {3, 3}, rng), ints({5, 3}), ints({1}), ints({4})}}, kExact);
}

// Sum folds input by input as the CPU kernel does; SumTo sums adjacent dims on the device (the
// leading ones: bias gradients; a middle one; all of them) and others on the host.
TEST(CudaKernels, SumAndSumToAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(19);
  const std::vector<std::vector<Shape>> sums = {{{3, 4}}, {{3, 4}, {3, 4}}, {{3, 4}, {4}, {1, 4}}, {{4}, {3, 4}},
                                                {{3, 1}, {1, 4}, {3, 4}}, {{2, 300}, {2, 300}, {300}}, {{0, 3}, {3}}};
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64})
    for (const auto& shapes : sums) {
      Case c{node("Sum", 1), {}};
      for (const Shape& s : shapes) c.inputs.push_back(random(dt, s, rng, -9, 9));
      expect_same_on_cuda(c);
    }
  const std::vector<std::pair<Shape, Shape>> sum_tos = {
      {{4, 5, 6}, {6}},     {{4, 5, 6}, {1, 6}}, {{64, 768}, {768}}, {{4, 5, 6}, {4, 1, 6}}, {{4, 5, 6}, {}},
      {{4, 5, 6}, {4, 5, 6}}, {{4, 5, 6}, {5, 1}}, {{0, 6}, {6}},       {{4, 1, 6}, {1, 1}}};
  for (DType dt : kFloatTypes)
    for (const auto& [x, target] : sum_tos)
      expect_same_on_cuda({node("SumTo", 1, {}, kOnnxTrainDomain), {random(dt, x, rng), ints(target)}});
}

// Gather along axis 0 (embedding rows, 16-byte units), a middle axis with odd rows, the last
// axis, negative and repeated indices, int32 indices, a scalar index, no indices, int64 data;
// GatherGrad sums repeated indices (a padding token many times over) in both argument orders.
TEST(CudaKernels, GatherAndGatherGradAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(20);
  auto indices = [&](const Shape& shape, int64_t dim) {
    std::vector<int64_t> v(size_t(numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = i % 5 == 0 ? 0 : int64_t(rng() % uint32_t(2 * dim)) - dim;
    return Tensor::from_vector(v, shape);
  };
  struct GatherCase {
    Shape data;
    int64_t axis;
    Shape idx;
  };
  const std::vector<GatherCase> cases = {{{100, 768}, 0, {2, 16}}, {{10, 8}, 0, {4}},  {{7, 5, 3}, 1, {2, 2}},
                                         {{7, 5, 3}, -1, {6}},     {{6, 4}, 0, {}},    {{6, 4}, 1, {0}},
                                         {{50, 130}, 0, {40}},     {{3, 9, 2}, 1, {3, 4}}};
  for (DType dt : kFloatTypes)
    for (const GatherCase& gc : cases) {
      const int64_t dim = gc.data[size_t(gc.axis < 0 ? gc.axis + int64_t(gc.data.size()) : gc.axis)];
      Tensor x = random(dt, gc.data, rng), idx = indices(gc.idx, dim);
      expect_same_on_cuda({node("Gather", 1, {{"axis", I(gc.axis)}}), {x, idx}}, kExact);
      Case fwd{node("Gather", 1, {{"axis", I(gc.axis)}}), {x, idx}};
      Model m = one_node_model(fwd);
      const Tensor dy = random(dt, Executor(m).run(feeds_of(fwd))[0].shape(), rng);
      expect_same_on_cuda({node("GatherGrad", 1, {{"axis", I(gc.axis)}}, kOnnxTrainDomain), {dy, ints(gc.data), idx}});
      expect_same_on_cuda({node("GatherGrad", 1, {{"axis", I(gc.axis)}}, kMsDomain), {ints(gc.data), idx, dy}});
    }
  expect_same_on_cuda({node("Gather", 1), {random(DType::kInt64, {4, 3}, rng, -9, 9), ints({3, -4, 1})}}, kExact);
  std::vector<int32_t> i32{2, 0, -1};
  expect_same_on_cuda({node("Gather", 1), {random(DType::kFloat32, {4, 3}, rng), Tensor::from_vector(i32, {3})}}, kExact);
}

// GatherGrad adds without atomics: the same bits on every run, however often an index repeats.
TEST(CudaKernels, GatherGradIsDeterministic) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(21);
  std::vector<int64_t> v(4096);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 2 ? 0 : int64_t(rng() % 30);  // half of them the padding id
  Case c{node("GatherGrad", 1, {}, kOnnxTrainDomain),
         {random(DType::kFloat32, {4096, 256}, rng), ints({30, 256}), Tensor::from_vector(v, {4096})}};
  Model m = one_node_model(c);
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor gpu(m, options);
  const Tensor first = gpu.run(feeds_of(c))[0];
  for (int run = 0; run < 3; ++run) {
    const Tensor again = gpu.run(feeds_of(c))[0];
    ASSERT_EQ(std::memcmp(again.data(), first.data(), first.nbytes()), 0) << "run " << run;
  }
  expect_same_on_cuda(c);
}

TEST(CudaKernels, AnOutOfRangeGatherIndexIsAnErrorOnTheGpuToo) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(22);
  for (Case c : {Case{node("Gather", 1), {random(DType::kFloat32, {4, 3}, rng), ints({0, 4})}},
                 Case{node("GatherGrad", 1, {}, kOnnxTrainDomain), {random(DType::kFloat32, {2, 3}, rng), ints({4, 3}), ints({-5, 1})}}}) {
    Model m = one_node_model(c);
    ExecutorOptions options;
    options.device = Device::kCuda;
    Executor gpu(m, options);
    EXPECT_NE(error_of([&] { gpu.run(feeds_of(c)); }).find("is out of range for a dimension of size 4"), std::string::npos)
        << c.node.op_type;
  }
}

// Gelu in both forms and their gradients, on lines that are and are not whole 16-byte packs; Erf
// in the unary family.
TEST(CudaKernels, GeluAndErfAgreeWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(23);
  for (DType dt : kFloatTypes)
    for (const Shape& shape : {Shape{3, 50}, Shape{4, 768}, Shape{7, 129}, Shape{0, 3}}) {
      Tensor x = random(dt, shape, rng, -5, 5), dy = random(dt, shape, rng);
      for (const char* form : {"none", "tanh"}) {
        const std::map<std::string, Attribute> attrs{{"approximate", Attribute::of(std::string(form))}};
        expect_same_on_cuda({node("Gelu", 1, attrs, kOnnxTrainDomain), {x}});
        expect_same_on_cuda({node("GeluGrad", 1, attrs, kOnnxTrainDomain), {dy, x}});
      }
      expect_same_on_cuda({node("Gelu", 1, {}, kMsDomain), {x}});
      expect_same_on_cuda({node("GeluGrad", 1, {}, kMsDomain), {dy, x}});
      expect_same_on_cuda({node("Gelu", 1), {x}, 20});
      expect_same_on_cuda({node("Erf", 1), {x}});
    }
  // float64 runs on the host, with the same result.
  expect_same_on_cuda({node("Gelu", 1, {}, kOnnxTrainDomain), {random(DType::kFloat64, {9}, rng)}});
}

// The fused output layer: loss and unit gradients, mean and sum, ignored rows, transB, with and
// without a bias, only the loss requested, every row ignored (mean: NaN as on the CPU), int32
// labels, and a vocabulary large enough for two chunks of rows.
TEST(CudaKernels, LinearSoftmaxCrossEntropyAgreesWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(24);
  struct LceCase {
    Shape a;
    int64_t classes;
    bool trans_b, bias;
  };
  for (const LceCase& lc : {LceCase{{2, 5, 16}, 40, false, true}, LceCase{{7, 33}, 50, true, false},
                            LceCase{{600, 16}, 30000, true, true}})
    for (const char* reduction : {"mean", "sum"})
      for (int64_t ignore : {int64_t(-1), int64_t(3)}) {
        const int64_t k = lc.a.back();
        Shape lshape(lc.a.begin(), lc.a.end() - 1);
        std::map<std::string, Attribute> attrs{{"reduction", Attribute::of(std::string(reduction))},
                                               {"transB", I(lc.trans_b)}};
        if (ignore >= 0) attrs["ignore_index"] = I(ignore);
        Case c{node("LinearSoftmaxCrossEntropy", lc.bias ? 4 : 3, attrs, kOnnxTrainDomain),
               {random(DType::kFloat32, lc.a, rng),
                random(DType::kFloat32, lc.trans_b ? Shape{lc.classes, k} : Shape{k, lc.classes}, rng),
                labels(lshape, lc.classes, rng)}};
        if (lc.bias) c.inputs.push_back(random(DType::kFloat32, {lc.classes}, rng));
        expect_same_on_cuda(c);
        Case loss_only = c;
        loss_only.node.outputs.resize(1);
        expect_same_on_cuda(loss_only);
      }
  std::map<std::string, Attribute> attrs{{"ignore_index", I(0)}};
  Case all_ignored{node("LinearSoftmaxCrossEntropy", 3, attrs, kOnnxTrainDomain),
                   {random(DType::kFloat32, {4, 8}, rng), random(DType::kFloat32, {8, 6}, rng), ints({0, 0, 0, 0})}};
  expect_same_on_cuda(all_ignored);
  std::vector<int32_t> l32{1, 5, 0, 2};
  expect_same_on_cuda({node("LinearSoftmaxCrossEntropy", 3, {}, kOnnxTrainDomain),
                       {random(DType::kFloat32, {4, 8}, rng), random(DType::kFloat32, {8, 6}, rng), Tensor::from_vector(l32, {4})}});
  // float64 runs on the host, with the same result.
  expect_same_on_cuda({node("LinearSoftmaxCrossEntropy", 3, {}, kOnnxTrainDomain),
                       {random(DType::kFloat64, {4, 8}, rng), random(DType::kFloat64, {8, 6}, rng), ints({1, 5, 0, 2})}});
}

TEST(CudaKernels, MultiTensorAdamWAgreesWithTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(9);
  const std::vector<Shape> shapes = {{300, 20}, {20}, {7, 3, 5}, {1}};
  for (const char* mode : {"adamw", "hf"})
    for (float clip : {0.0f, 0.5f}) {
      std::map<std::string, Attribute> attrs{{"mode", Attribute::of(std::string(mode))}, {"in_place", I(0)},
                                             {"max_grad_norm", F(clip)}, {"weight_decay", F(0.1f)}};
      Case c{node("AdamW", 3 * shapes.size(), attrs, kOnnxTrainDomain), {Tensor::scalar(1e-2f), Tensor::scalar<int64_t>(3)}};
      for (const Shape& s : shapes) c.inputs.push_back(random(DType::kFloat32, s, rng));
      for (const Shape& s : shapes) c.inputs.push_back(random(DType::kFloat32, s, rng));
      for (const Shape& s : shapes) c.inputs.push_back(random(DType::kFloat32, s, rng, -0.1f, 0.1f));
      for (const Shape& s : shapes) c.inputs.push_back(random(DType::kFloat32, s, rng, 0.0f, 0.1f));
      expect_same_on_cuda(c);
    }
}

// AdamW with in_place = 1 on parameters and state held as initializers (host values the executor
// copies to the device): float32 runs the device kernel, float64 the CPU kernel on host copies.
// Either way the initializers themselves take each step's update, outputs requested or not, as
// on the CPU; nothing reverts to stale host values on the next run.
TEST(CudaKernels, InPlaceAdamWUpdatesTheInitializersItWasGivenCopiesOf) {
  SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    std::mt19937 rng(12);
    auto model = [&](std::mt19937 r) {
      Graph g;
      g.inputs = {value("lr", DType::kFloat32, Shape{}), value("step", DType::kInt64, Shape{}),
                  value("g", dt, Shape{5, 3})};
      for (const char* name : {"p", "m", "v"}) {
        g.initializers[name] = random(dt, {5, 3}, r, name[0] == 'v' ? 0.0f : -1.0f, 1.0f);
      }
      Node n = make_node("AdamW", {"lr", "step", "p", "g", "m", "v"}, {"p_new", "m_new", "v_new"});
      n.domain = kOnnxTrainDomain;
      n.attributes = {{"in_place", I(1)}, {"weight_decay", F(0.1f)}};
      g.nodes = {n};
      g.outputs = {value("p_new", dt, std::nullopt)};
      Model m = test::make_model(std::move(g), 17);
      m.opsets[kOnnxTrainDomain] = 1;
      return m;
    };
    Model on_cpu = model(rng), on_gpu = model(rng);  // the same draws: rng is copied
    std::mt19937 grad_rng(14);
    const Tensor grad = random(dt, {5, 3}, grad_rng);
    ExecutorOptions options;
    options.device = Device::kCuda;
    Executor cpu(on_cpu), gpu(on_gpu, options);
    for (int64_t step = 1; step <= 3; ++step) {
      const std::map<std::string, Tensor> feeds{{"lr", Tensor::scalar(0.05f)}, {"step", Tensor::scalar(step)}, {"g", grad}};
      cpu.run(feeds);
      gpu.run(feeds, step == 2 ? std::vector<std::string>{"p_new"} : std::vector<std::string>{});
      for (const char* name : {"p", "m", "v"})
        EXPECT_LE(difference(on_gpu.graph.initializers.at(name), on_cpu.graph.initializers.at(name)), 1e-6)
            << name << " after step " << step;
    }
  }
}

// If's branches run on the host: one reading a value the device made in the outer graph gets a
// host copy of it.
TEST(CudaKernels, AnIfBranchReadsAnOuterDeviceValue) {
  SKIP_WITHOUT_CUDA();
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{8}), value("cond", DType::kBool, Shape{})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  Node relu = make_node("Relu", {"x"}, {"h"}), choose = make_node("If", {"cond"}, {"y"});
  choose.attributes["then_branch"] = test::one_node_branch("Neg", "h");  // "h": the outer graph's
  choose.attributes["else_branch"] = test::one_node_branch("Abs", "h");
  g.nodes = {relu, choose};
  Model m = test::make_model(std::move(g), 17);
  std::mt19937 rng(13);
  const Tensor x = random(DType::kFloat32, {8}, rng);
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor cpu(m), gpu(m, options);
  for (bool cond : {true, false, true}) {
    const std::map<std::string, Tensor> feeds{{"x", x}, {"cond", Tensor::scalar(cond)}};
    EXPECT_EQ(difference(to_device(gpu.run(feeds)[0], Device::kCpu), cpu.run(feeds)[0]), 0.0) << "cond " << cond;
  }
}

// x -> Gemm -> Relu -> Gemm -> softmax cross-entropy, its backward written out, and AdamW: the
// training step of an MLP in one graph, run for 20 steps on each device.
TEST(CudaKernels, AnMlpTrainingStepFollowsTheCpuLossCurve) {
  SKIP_WITHOUT_CUDA();
  const int64_t batch = 32, in = 24, hidden = 64, classes = 10;
  Graph g;
  const std::vector<std::pair<std::string, Shape>> params = {
      {"W1", {in, hidden}}, {"b1", {hidden}}, {"W2", {hidden, classes}}, {"b2", {classes}}};
  g.inputs = {value("x", DType::kFloat32, Shape{batch, in}), value("t", DType::kInt64, Shape{batch}),
              value("lr", DType::kFloat32, Shape{}), value("step", DType::kInt64, Shape{})};
  for (const char* prefix : {"", "m_", "v_"})
    for (const auto& [name, shape] : params) g.inputs.push_back(value(prefix + name, DType::kFloat32, shape));
  g.initializers["one"] = Tensor::scalar(1.0f);
  g.initializers["axis0"] = ints({0});
  auto n = [&](std::string op, std::vector<std::string> ins, std::vector<std::string> outs,
               std::map<std::string, Attribute> attrs = {}, std::string domain = "") {
    Node nd = make_node(std::move(op), std::move(ins), std::move(outs));
    nd.attributes = std::move(attrs);
    nd.domain = std::move(domain);
    g.nodes.push_back(nd);
  };
  n("Gemm", {"x", "W1", "b1"}, {"h"});
  n("Relu", {"h"}, {"r"});
  n("Gemm", {"r", "W2", "b2"}, {"logits"});
  n("SoftmaxCrossEntropyLoss", {"logits", "t"}, {"loss", "logp"});
  n("SoftmaxCrossEntropyLossGrad", {"one", "logp", "t"}, {"dlogits"}, {}, kOnnxTrainDomain);
  n("FusedMatMul", {"r", "dlogits"}, {"dW2"}, {{"transA", I(1)}}, kOnnxTrainDomain);
  n("ReduceSum", {"dlogits", "axis0"}, {"db2"}, {{"keepdims", I(0)}});
  n("FusedMatMul", {"dlogits", "W2"}, {"dr"}, {{"transB", I(1)}}, kOnnxTrainDomain);
  n("ReluGrad", {"dr", "r"}, {"dh"}, {}, kOnnxTrainDomain);
  n("FusedMatMul", {"x", "dh"}, {"dW1"}, {{"transA", I(1)}}, kOnnxTrainDomain);
  n("ReduceSum", {"dh", "axis0"}, {"db1"}, {{"keepdims", I(0)}});
  std::vector<std::string> update_in{"lr", "step"}, update_out;
  for (const char* prefix : {"", "d", "m_", "v_"})
    for (const auto& p : params) update_in.push_back(prefix + p.first);
  for (const char* prefix : {"", "m_", "v_"})
    for (const auto& p : params) update_out.push_back("new_" + std::string(prefix) + p.first);
  n("AdamW", update_in, update_out, {{"in_place", I(0)}, {"max_grad_norm", F(1.0f)}}, kOnnxTrainDomain);
  g.outputs = {value("loss", DType::kFloat32, std::nullopt)};
  for (const auto& o : update_out) g.outputs.push_back(value(o, DType::kFloat32, std::nullopt));
  Model m = test::make_model(std::move(g), 18);
  m.opsets[kOnnxTrainDomain] = 1;

  std::mt19937 rng(10);
  std::map<std::string, Tensor> state;
  for (const auto& [name, shape] : params) {
    state[name] = random(DType::kFloat32, shape, rng, -0.3f, 0.3f);
    state["m_" + name] = Tensor::zeros(DType::kFloat32, shape);
    state["v_" + name] = Tensor::zeros(DType::kFloat32, shape);
  }
  const Tensor x = random(DType::kFloat32, {batch, in}, rng), t = labels({batch}, classes, rng);
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor cpu(m), gpu(m, options);
  std::map<std::string, Tensor> cpu_state = state, gpu_state = state;
  for (int64_t step = 1; step <= 20; ++step) {
    std::vector<float> losses;
    for (auto* run : {&cpu_state, &gpu_state}) {
      std::map<std::string, Tensor> feeds = *run;
      feeds["x"] = x;
      feeds["t"] = t;
      feeds["lr"] = Tensor::scalar(0.01f);
      feeds["step"] = Tensor::scalar(step);
      const auto out = (run == &cpu_state ? cpu : gpu).run(feeds);
      losses.push_back(out[0].data<float>()[0]);
      size_t k = 1;
      for (const char* prefix : {"", "m_", "v_"})
        for (const auto& p : params) (*run)[prefix + p.first] = out[k++];
    }
    EXPECT_NEAR(losses[1], losses[0], 1e-4 * std::abs(losses[0])) << "step " << step;
  }
  for (const auto& [name, shape] : params) EXPECT_LE(difference(gpu_state[name], cpu_state[name]), 1e-4) << name;
}

}  // namespace onnxtrain
