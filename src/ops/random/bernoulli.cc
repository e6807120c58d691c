// Bernoulli (opset 15): y[i] = 1 with probability x[i], else 0; y has the `dtype` attribute's type
// (default: x's). Draws come from an MT19937 stream seeded with the `seed` attribute (from
// std::random_device when absent) and advanced across runs, so each run draws fresh values; each
// u in [0, 1) is a 53-bit double made of two 32-bit draws (numpy's legacy construction, as
// Dropout), and y[i] = u < x[i].
#include <cmath>
#include <random>

#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

DType bernoulli_dtype(const Node& node, DType input) {
  if (!node.has_attr("dtype")) return input;
  int64_t v = node.attr_int("dtype", 0);
  DType dt = DType(int32_t(v));
  OT_CHECK(v > 0 && v <= 16 && dt != DType::kString && (dt == DType::kBool || is_floating(dt) || is_integer(dt)) &&
               dtype_supported(dt),
           node.context(), "dtype ", v, " is not a supported numeric or bool type");
  return dt;
}

void bernoulli_shape(ShapeContext& ctx) {
  ctx.set_output(0, bernoulli_dtype(ctx.node(), ctx.input_dtype(0)), ctx.input_shape(0));
}

class BernoulliKernel final : public Kernel {
 public:
  explicit BernoulliKernel(const Node& node) {
    if (node.has_attr("seed")) gen_.seed(uint32_t(int64_t(node.attr_float("seed", 0.0f))));
    else gen_.seed(std::random_device{}());
  }

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    OT_CHECK(is_floating(x.dtype()), node.context(), "input must be floating-point probabilities, got ",
             dtype_name(x.dtype()));
    const int64_t n = x.numel();
    std::vector<double> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      p[size_t(i)] = x.item_as_double(i);
      OT_CHECK(p[size_t(i)] >= 0.0 && p[size_t(i)] <= 1.0, node.context(), "probability x[", i, "] = ",
               p[size_t(i)], " is outside [0, 1]");
    }
    Tensor& y = ctx.output(0, bernoulli_dtype(node, x.dtype()), x.shape());
    dispatch_all(y.dtype(), [&]<typename T>() {
      T* py = y.data<T>();
      for (int64_t i = 0; i < n; ++i) {  // sequential: the stream order defines the result
        uint32_t a = gen_() >> 5, b = gen_() >> 6;
        double u = (double(a) * 67108864.0 + double(b)) / 9007199254740992.0;
        py[i] = cast_value<T>(u < p[size_t(i)] ? 1 : 0);
      }
    });
  }

 private:
  std::mt19937 gen_;
};

}  // namespace

// Random 0/1 samples: no gradient flows to the probabilities.
ONNXTRAIN_OP(Bernoulli, kOnnxDomain, 15).inputs(1).outputs(1).shape(bernoulli_shape).not_differentiable()
    .cpu_kernel<BernoulliKernel>();

}  // namespace onnxtrain
