// The minimal build's own kernels against the reference loops the full build keeps for other
// dtypes: the blocked GEMM (every transpose, batch broadcast, alpha/beta/bias, sizes across the
// register and cache blocks), convolution forward, transposed and backward (groups, strides,
// dilations, asymmetric pads, 1-d to 3-d, channels-last, activations), 2-d pooling against
// direct loops, and models written and read back through the wire-format model I/O. Built and
// run only by the minimal build (cmake/minimal.cmake), natively and under qemu-aarch64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "backends/cpu/conv.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/pool.h"
#include "onnx/model_io.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
#include "ops/build_ops.h"
#include "ops/registry.h"
#include "ops/conv/conv_reference.h"

namespace onnxtrain {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// |a - b| <= tol * (1 + |b|) everywhere: float sums in another order.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(a[i] - b[i]), tol * (1.0f + std::fabs(b[i]))) << what << " at " << i << ": " << a[i]
                                                                       << " vs " << b[i];
}

TEST(MinimalBackend, MatmulMatchesTheReference) {
  struct Case { Shape a_batch, b_batch; int64_t m, n, k; bool ta, tb; float alpha, beta; bool bias; };
  const std::vector<Case> cases = {
      {{}, {}, 1, 1, 1, false, false, 1, 0, false},
      {{}, {}, 13, 45, 700, false, false, 1, 0, true},       // across KC slices, partial tiles
      {{}, {}, 64, 288, 2048, false, true, 1, 0, false},     // conv dW shape, B transposed
      {{}, {}, 288, 2048, 64, true, false, 1, 0, false},     // conv dX shape, A transposed
      {{}, {}, 7, 33, 9, true, true, 0.5f, 2.0f, true},
      {{3}, {1}, 10, 17, 31, false, false, 1, 0, false},     // B broadcast: folds into M
      {{2, 1}, {1, 3}, 5, 6, 7, true, false, 1, 0.5f, false},  // batch broadcast both ways
      {{4}, {4}, 33, 65, 129, false, true, 2.0f, 0, true},
      {{}, {}, 800, 40, 20, false, false, 1, 0, false},      // more rows than one packed block
      {{}, {}, 5, 4200, 3, false, false, 1, 0, false},       // more columns than one packed block
      {{}, {}, 4, 5, 0, false, false, 1, 0.5f, true},        // empty sum: beta C + bias
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    cpu::MatmulDims d;
    d.a_batch = c.a_batch, d.b_batch = c.b_batch, d.m = c.m, d.n = c.n, d.k = c.k;
    d.trans_a = c.ta, d.trans_b = c.tb, d.alpha = c.alpha, d.beta = c.beta, d.bias = c.bias;
    const std::string what = "m" + std::to_string(c.m) + " n" + std::to_string(c.n) + " k" + std::to_string(c.k);
    auto a = random_values(size_t(numel(c.a_batch) * c.m * c.k), seed++);
    auto b = random_values(size_t(numel(c.b_batch) * c.k * c.n), seed++);
    auto bias = random_values(size_t(c.n), seed++);
    auto c0 = random_values(size_t(d.batch_count() * c.m * c.n), seed++);
    std::vector<float> got = c0, want = c0;
    cpu::Matmul(d, what).run(a.data(), b.data(), got.data(), bias.data());
    cpu::matmul_reference<float>(d, a.data(), b.data(), want.data(), bias.data());
    expect_close(got, want, 1e-4f, what);
  }
}

struct ConvCase {
  Shape x;                 // [N, C, spatial...]
  int64_t m, group;
  std::vector<int64_t> kernel, stride, dilation, pad_l, pad_r;
  bool bias;
};

WindowGeometry geometry(const ConvCase& c, bool transposed) {
  WindowGeometry g{c.kernel, c.stride, c.dilation, c.pad_l, c.pad_r, {}};
  for (size_t i = 0; i < c.kernel.size(); ++i) {
    const int64_t in = c.x[i + 2], ek = g.effective(i);
    g.out.push_back(transposed ? (in - 1) * c.stride[i] - c.pad_l[i] - c.pad_r[i] + ek
                               : (in + c.pad_l[i] + c.pad_r[i] - ek) / c.stride[i] + 1);
  }
  return g;
}

cpu::ConvSpec spec_of(const ConvCase& c, const WindowGeometry& g, bool transposed) {
  cpu::ConvSpec s;
  s.transposed = transposed;
  s.x = c.x;
  s.out_channels = c.m;
  s.group = c.group;
  s.bias = c.bias;
  s.kernel = g.kernel, s.stride = g.stride, s.dilation = g.dilation, s.pad_l = g.pad_l, s.pad_r = g.pad_r;
  s.out = g.out;
  return s;
}

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {{2, 1, 8, 8}, 4, 1, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, true},
      {{3, 4, 9, 7}, 6, 2, {3, 2}, {2, 1}, {1, 2}, {0, 1}, {2, 0}, true},   // groups, asymmetric pads
      {{1, 3, 11}, 5, 1, {4}, {3}, {2}, {2}, {1}, false},                    // 1-d, dilation
      {{2, 2, 4, 5, 3}, 4, 2, {2, 3, 1}, {1, 2, 1}, {1, 1, 1}, {1, 0, 0}, {0, 1, 0}, true},  // 3-d
      {{33, 8, 6, 6}, 16, 1, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, false},  // many images per GEMM
  };
  return cases;
}

TEST(MinimalBackend, ConvolutionForwardMatchesTheReference) {
  uint32_t seed = 100;
  for (const ConvCase& c : conv_cases()) {
    const WindowGeometry g = geometry(c, false);
    const std::vector<int64_t> in(c.x.begin() + 2, c.x.end());
    const int64_t n = c.x[0], ch = c.x[1];
    auto x = random_values(size_t(numel(c.x)), seed++);
    auto w = random_values(size_t(c.m * (ch / c.group) * numel(c.kernel)), seed++);
    auto b = random_values(size_t(c.m), seed++);
    std::vector<float> got(size_t(n * c.m * numel(g.out))), want(got.size());
    cpu::ConvPrimitive(spec_of(c, g, false), "conv").run(x.data(), w.data(), c.bias ? b.data() : nullptr, got.data());
    conv_reference<float>(x.data(), w.data(), c.bias ? b.data() : nullptr, want.data(), n, ch, c.m, c.group, in, g);
    expect_close(got, want, 1e-4f, "conv " + shape_str(c.x));

    // With a Relu inside the primitive, and with X and Y channels last (FusedConv chains).
    cpu::ConvSpec fused = spec_of(c, g, false);
    fused.activation = cpu::ConvActivation::kRelu;
    fused.x_channels_last = fused.y_channels_last = true;
    const int64_t xs = numel(in), ys = numel(g.out);
    std::vector<float> x_last(x.size()), y_last(got.size()), relu(want.size()), back(got.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < ch; ++k)
        for (int64_t p = 0; p < xs; ++p) x_last[size_t((i * xs + p) * ch + k)] = x[size_t((i * ch + k) * xs + p)];
    cpu::ConvPrimitive(fused, "fused").run(x_last.data(), w.data(), c.bias ? b.data() : nullptr, y_last.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < c.m; ++k)
        for (int64_t p = 0; p < ys; ++p) {
          back[size_t((i * c.m + k) * ys + p)] = y_last[size_t((i * ys + p) * c.m + k)];
          relu[size_t((i * c.m + k) * ys + p)] = std::max(0.0f, want[size_t((i * c.m + k) * ys + p)]);
        }
    expect_close(back, relu, 1e-4f, "fused conv " + shape_str(c.x));

    // A summand Z that is Y's own buffer (FusedConv's residual, summed in place), in both layouts.
    cpu::ConvSpec summed = spec_of(c, g, false);
    summed.sum = true;
    auto z = random_values(got.size(), seed++);
    std::vector<float> in_place = z, want_sum(want.size());
    for (size_t i = 0; i < want.size(); ++i) want_sum[i] = want[i] + z[i];
    cpu::ConvPrimitive(summed, "summed").run(x.data(), w.data(), c.bias ? b.data() : nullptr, in_place.data(), false,
                                             in_place.data());
    expect_close(in_place, want_sum, 1e-4f, "conv + Z in place " + shape_str(c.x));
    summed.x_channels_last = summed.y_channels_last = true;
    std::vector<float> z_last(z.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < c.m; ++k)
        for (int64_t p = 0; p < ys; ++p) z_last[size_t((i * ys + p) * c.m + k)] = z[size_t((i * c.m + k) * ys + p)];
    cpu::ConvPrimitive(summed, "summed").run(x_last.data(), w.data(), c.bias ? b.data() : nullptr, z_last.data(), false,
                                             z_last.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < c.m; ++k)
        for (int64_t p = 0; p < ys; ++p) back[size_t((i * c.m + k) * ys + p)] = z_last[size_t((i * ys + p) * c.m + k)];
    expect_close(back, want_sum, 1e-4f, "channels-last conv + Z in place " + shape_str(c.x));
  }
}

TEST(MinimalBackend, TransposedConvolutionMatchesTheReference) {
  uint32_t seed = 200;
  for (const ConvCase& c : conv_cases()) {
    const WindowGeometry g = geometry(c, true);
    const std::vector<int64_t> in(c.x.begin() + 2, c.x.end());
    const int64_t n = c.x[0], ch = c.x[1];
    auto x = random_values(size_t(numel(c.x)), seed++);
    auto w = random_values(size_t(ch * (c.m / c.group) * numel(c.kernel)), seed++);  // [C, M/G, k...]
    auto b = random_values(size_t(c.m), seed++);
    std::vector<float> got(size_t(n * c.m * numel(g.out))), want(got.size());
    cpu::ConvPrimitive(spec_of(c, g, true), "deconv").run(x.data(), w.data(), c.bias ? b.data() : nullptr, got.data());
    conv_transpose_reference<float>(x.data(), w.data(), c.bias ? b.data() : nullptr, want.data(), n, ch, c.m, c.group,
                                    in, g);
    expect_close(got, want, 1e-4f, "conv transpose " + shape_str(c.x));
  }
}

TEST(MinimalBackend, ConvolutionBackwardMatchesTheReference) {
  uint32_t seed = 300;
  for (const ConvCase& c : conv_cases()) {
    const WindowGeometry g = geometry(c, false);
    const std::vector<int64_t> in(c.x.begin() + 2, c.x.end());
    const int64_t n = c.x[0], ch = c.x[1];
    auto x = random_values(size_t(numel(c.x)), seed++);
    auto w = random_values(size_t(c.m * (ch / c.group) * numel(c.kernel)), seed++);
    auto dy = random_values(size_t(n * c.m * numel(g.out)), seed++);
    std::vector<float> dx(x.size()), dw(w.size()), db(size_t(c.m)), rdx(x.size()), rdw(w.size()), rdb(size_t(c.m));
    cpu::ConvBackwardPrimitive(spec_of(c, g, false), true, true, "conv grad")
        .run(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data());
    conv_backward_reference<float>(dy.data(), x.data(), w.data(), rdx.data(), rdw.data(), rdb.data(), n, ch, c.m,
                                   c.group, in, g);
    expect_close(dx, rdx, 1e-4f, "dX " + shape_str(c.x));
    expect_close(dw, rdw, 1e-3f, "dW " + shape_str(c.x));
    if (c.bias) expect_close(db, rdb, 1e-3f, "dB " + shape_str(c.x));
  }
}

TEST(MinimalBackend, PoolingMatchesDirectLoops) {
  struct PoolCase { Shape x; std::vector<int64_t> kernel, stride, dilation, pad_l, pad_r; bool max, include_pad; };
  const std::vector<PoolCase> cases = {
      {{2, 3, 8, 8}, {2, 2}, {2, 2}, {1, 1}, {0, 0}, {0, 0}, true, false},
      {{1, 2, 7, 6}, {3, 2}, {1, 2}, {1, 1}, {0, 0}, {0, 0}, true, false},  // dense, overlapping windows
      {{1, 2, 7, 6}, {3, 2}, {2, 1}, {1, 2}, {1, 0}, {1, 1}, true, false},
      {{1, 2, 7, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, false, false},
      {{1, 2, 7, 6}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, false, true},
  };
  uint32_t seed = 400;
  for (const PoolCase& c : cases) {
    cpu::PoolSpec s;
    s.max = c.max, s.count_include_pad = c.include_pad, s.x = c.x;
    s.kernel = c.kernel, s.stride = c.stride, s.dilation = c.dilation, s.pad_l = c.pad_l, s.pad_r = c.pad_r;
    for (size_t d = 0; d < 2; ++d)
      s.out.push_back((c.x[d + 2] + c.pad_l[d] + c.pad_r[d] - ((c.kernel[d] - 1) * c.dilation[d] + 1)) / c.stride[d] + 1);
    auto pool = cpu::PoolPrimitive::make(s, true, "pool");
    ASSERT_TRUE(pool.has_value());
    auto x = random_values(size_t(numel(c.x)), seed++);
    const int64_t planes = c.x[0] * c.x[1], h = c.x[2], w = c.x[3], oh = s.out[0], ow = s.out[1];
    auto dy = random_values(size_t(planes * oh * ow), seed++);
    std::vector<float> y(dy.size()), want(dy.size()), dx(x.size()), want_dx(x.size(), 0.0f);
    pool->forward(x.data(), y.data());
    pool->backward(dy.data(), x.data(), dx.data());
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          float acc = c.max ? -std::numeric_limits<float>::infinity() : 0.0f;
          int64_t taps = 0, padded = 0, best = -1;
          for (int64_t a = 0; a < c.kernel[0]; ++a)
            for (int64_t b = 0; b < c.kernel[1]; ++b) {
              const int64_t r = i * c.stride[0] - c.pad_l[0] + a * c.dilation[0];
              const int64_t q = j * c.stride[1] - c.pad_l[1] + b * c.dilation[1];
              padded += r >= -c.pad_l[0] && r < h + c.pad_r[0] && q >= -c.pad_l[1] && q < w + c.pad_r[1];
              if (r < 0 || r >= h || q < 0 || q >= w) continue;
              const int64_t at = p * h * w + r * w + q;
              ++taps;
              if (c.max && (best < 0 || x[size_t(at)] > acc)) acc = x[size_t(at)], best = at;
              if (!c.max) acc += x[size_t(at)];
            }
          const size_t o = size_t((p * oh + i) * ow + j);
          const float count = float(c.include_pad ? padded : taps);
          want[o] = c.max ? acc : acc / count;
          if (c.max) {
            want_dx[size_t(best)] += dy[o];
          } else {
            for (int64_t a = 0; a < c.kernel[0]; ++a)
              for (int64_t b = 0; b < c.kernel[1]; ++b) {
                const int64_t r = i * c.stride[0] - c.pad_l[0] + a * c.dilation[0];
                const int64_t q = j * c.stride[1] - c.pad_l[1] + b * c.dilation[1];
                if (r >= 0 && r < h && q >= 0 && q < w) want_dx[size_t(p * h * w + r * w + q)] += dy[o] / count;
              }
          }
        }
    expect_close(y, want, 1e-6f, "pool forward");
    expect_close(dx, want_dx, 1e-5f, "pool backward");
  }
}

TEST(MinimalBackend, ModelsRoundTripThroughTheWireFormat) {
  const auto dir = std::filesystem::temp_directory_path() / ("onnxtrain_minimal_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Model m;
  m.opsets[""] = 17;
  m.graph.inputs = {{"x", ValueInfo{DType::kFloat32, Shape{-1, 4}, {"batch", ""}}}};
  m.graph.outputs = {{"y", ValueInfo{DType::kFloat32, Shape{-1, 4}, {"batch", ""}}}};
  m.graph.initializers["w"] = Tensor::from_vector(random_values(4 * 300, 7), {300, 4});
  Node node;
  node.op_type = "Add", node.name = "add", node.inputs = {"x", "x"}, node.outputs = {"y"};
  node.attributes["note"] = Attribute::of(std::string("kept"));
  m.graph.nodes = {node};
  for (bool external : {false, true}) {
    const std::string path = (dir / (external ? "ext.onnx" : "inline.onnx")).string();
    save_model(m, path, external);
    EXPECT_EQ(std::filesystem::exists(path + ".data"), external);
    Model back = load_model(path);
    EXPECT_EQ(save_model_to_bytes(back), save_model_to_bytes(m));
    EXPECT_EQ(back.graph.initializers.at("w").data<float>()[1199], m.graph.initializers.at("w").data<float>()[1199]);
  }
  std::filesystem::remove_all(dir);
}

// A one-node model of op_type on a [2] float input; the error its session gives, or "<no error>".
std::string session_error(const std::string& op_type) {
  Model m;
  m.opsets[""] = 17;
  m.graph.inputs = {{"x", ValueInfo{DType::kFloat32, Shape{2}, {}}}};
  m.graph.outputs = {{"y", ValueInfo{DType::kFloat32, Shape{2}, {}}}};
  Node node;
  node.op_type = op_type, node.name = "the_node", node.inputs = {"x"}, node.outputs = {"y"};
  m.graph.nodes = {node};
  try {
    InferenceSession::from_bytes(save_model_to_bytes(m));
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(MinimalBackend, LeftOutOpsAreNamedWithTheOptionThatAddsThem) {
  // Whichever of these ops this build's ONNXTRAIN_OPS left out: the error names the op and the option.
  int left_out = 0;
  for (const char* op : {"Conv", "LSTM", "GridSample", "Einsum", "Relu", "Gelu", "Softmax", "Det"}) {
    if (!op_left_out_of_build(op)) continue;
    ++left_out;
    const std::string message = session_error(op);
    EXPECT_NE(message.find(std::string("op '") + op + "' is not in this minimal build"), std::string::npos) << message;
    EXPECT_NE(message.find("-DONNXTRAIN_OPS"), std::string::npos) << message;
  }
  // An op no build has stays an unknown op.
  EXPECT_FALSE(op_left_out_of_build("NoSuchOp"));
  EXPECT_NE(session_error("NoSuchOp").find("unknown op 'NoSuchOp'"), std::string::npos);
  RecordProperty("left_out_ops_checked", left_out);
}

TEST(MinimalBackend, OpsAreSelectedOneByOneWithoutGradientRules) {
  // Ops that share a file (unary_math.cc, pool.cc, conv.cc): each is in the build exactly when
  // the registry has it, whatever its file neighbours are. In the digits build Relu and MaxPool
  // are in and Abs, Exp and AveragePool are out, though their files are compiled.
  int split_files = 0;
  auto registered = [](const std::string& op) {
    return !OpRegistry::global().versions(kOnnxDomain, op).empty() ||
           !OpRegistry::global().versions(kOnnxTrainDomain, op).empty();
  };
  for (const auto& [in_file, neighbour] : std::vector<std::pair<std::string, std::string>>{
           {"Relu", "Abs"}, {"Relu", "Exp"}, {"MaxPool", "AveragePool"}, {"Conv", "FusedConv"}}) {
    for (const std::string& op : {in_file, neighbour})
      EXPECT_EQ(registered(op), !op_left_out_of_build(op)) << op;
    if (registered(in_file) && !registered(neighbour)) {
      ++split_files;
      EXPECT_NE(session_error(neighbour).find("op '" + neighbour + "' is not in this minimal build"), std::string::npos);
    }
  }
  RecordProperty("files_split_by_op", split_files);
  // The minimal runtime runs prepared artifacts: schemas keep their gradient status, not their rules.
  for (const OpSchema* schema : OpRegistry::global().all()) {
    EXPECT_FALSE(schema->gradient) << schema->op_type;
    if (schema->op_type == "Relu") {
      EXPECT_EQ(schema->gradient_status, GradientStatus::kDifferentiable);
    }
  }
}

TEST(MinimalBackend, ChannelsLastPoolRunsThePlainPoolOnReorderedCopies) {
  // This backend has no channels-last pooling: onnxtrain.ChannelsLastPool (what the layout pass
  // makes of a pool between convolutions) reorders X, pools, and reorders Y back.
  if (OpRegistry::global().versions(kOnnxTrainDomain, "ChannelsLastPool").empty()) GTEST_SKIP() << "op left out";
  const int64_t n = 2, c = 3, h = 5, w = 4, oh = 2, ow = 2;  // 2x2 windows, stride 2, no pads
  for (const char* mode : {"max", "average"}) {
    Model m;
    m.opsets[""] = 17;
    m.opsets[kOnnxTrainDomain] = 1;
    m.graph.inputs = {{"x", ValueInfo{DType::kFloat32, Shape{n, c, h, w}, {}}}};
    m.graph.outputs = {{"y", ValueInfo{DType::kFloat32, Shape{n, c, oh, ow}, {}}}};
    Node node;
    node.op_type = "ChannelsLastPool", node.domain = kOnnxTrainDomain, node.name = "pool";
    node.inputs = {"x"}, node.outputs = {"y"};
    node.attributes["mode"] = Attribute::of(std::string(mode));
    node.attributes["kernel_shape"] = Attribute::of(std::vector<int64_t>{2, 2});
    node.attributes["strides"] = Attribute::of(std::vector<int64_t>{2, 2});
    m.graph.nodes = {node};
    auto values = random_values(size_t(n * c * h * w), 500);
    Tensor x = Tensor::from_vector(values, {n, c, h, w});  // read as [N, H, W, C] memory
    auto sess = InferenceSession::from_bytes(save_model_to_bytes(m));
    Tensor y = sess.run({{"x", x}})[0];
    ASSERT_EQ(y.shape(), (Shape{n, c, oh, ow}));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < oh; ++r)
        for (int64_t q = 0; q < ow; ++q)
          for (int64_t k = 0; k < c; ++k) {
            float want = std::string(mode) == "max" ? -std::numeric_limits<float>::infinity() : 0.0f;
            for (int64_t a = 0; a < 2; ++a)
              for (int64_t b = 0; b < 2; ++b) {
                const float v = values[size_t(((i * h + 2 * r + a) * w + 2 * q + b) * c + k)];
                want = std::string(mode) == "max" ? std::max(want, v) : want + v / 4;
              }
            EXPECT_NEAR(y.data<float>()[((i * oh + r) * ow + q) * c + k], want, 1e-5f) << mode;
          }
  }
}

// ONNX Runtime's checkpoint format needs no library, so the minimal build (and the aarch64 cross
// build, under qemu) reads and writes it as the full build does.
TEST(MinimalCheckpoint, OrtFormatRoundTrip) {
  CheckpointState s;
  std::vector<float> w = random_values(24, 3), m = random_values(24, 4);
  Tensor tw = Tensor::empty(DType::kFloat32, {4, 6}), tm = Tensor::empty(DType::kFloat32, {4, 6});
  std::memcpy(tw.data(), w.data(), 96);
  std::memcpy(tm.data(), m.data(), 96);
  s.add_parameter("w", tw, true);
  s.add_parameter("b", Tensor::zeros(DType::kFloat32, {6}), false);
  s.set_optimizer_tensor("w", "exp_avg", tm);
  s.optimizer_state().step = 5;
  s.add_property("epoch", int64_t{2});
  const std::string path = (std::filesystem::temp_directory_path() / "onnxtrain_minimal_ort_ckpt").string();
  s.save(path, true, CheckpointFormat::kOrt);
  ASSERT_EQ(CheckpointState::file_format(path), CheckpointFormat::kOrt);
  CheckpointState back = CheckpointState::load(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.parameter_names(), (std::vector<std::string>{"w", "b"}));
  EXPECT_EQ(std::memcmp(back.get_parameter("w").data(), w.data(), 96), 0);
  EXPECT_EQ(std::memcmp(back.optimizer_state().param_states.at("w").at("exp_avg").data(), m.data(), 96), 0);
  EXPECT_EQ(back.optimizer_state().step, 5);
  EXPECT_EQ(std::get<int64_t>(back.get_property("epoch")), 2);
}

}  // namespace
}  // namespace onnxtrain
