// com.microsoft.InPlaceAccumulatorV2, the gradient accumulation of ONNX Runtime's training
// artifacts (one per trainable parameter, fed by the `<p>_grad.accumulation.buffer` inputs):
//
//   inputs  buffer, value, overwrite? (bool scalar; absent: false)
//   outputs updated (bool [1], always true), buffer_new? = overwrite ? value : buffer + value
//
// ORT writes buffer_new over the buffer input and exposes only the flag. onnxtrain's kernels never
// write their inputs: buffer_new is an ordinary output (which may take the buffer's storage when
// the buffer is not read again). A Module given ORT's training graph does not run this op at all: it
// takes the gradient itself and accumulates it in the parameter, as for its own artifacts
// (src/training/ort_artifacts.cc).
#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void accumulator_shape(ShapeContext& ctx) {
  ctx.set_output(0, DType::kBool, Shape{1});
  if (ctx.num_outputs() > 1) ctx.set_output(1, ctx.input_dtype(0), ctx.input_shape(0));
}

void accumulator_kernel(KernelContext& ctx) {
  const Tensor& buffer = ctx.input(0);
  const Tensor& value = ctx.input(1);
  OT_CHECK(buffer.dtype() == value.dtype() && buffer.shape() == value.shape(), ctx.node().context(),
           "the buffer and the value must have one dtype and shape, got ", dtype_name(buffer.dtype()),
           shape_str(buffer.shape()), " and ", dtype_name(value.dtype()), shape_str(value.shape()));
  bool overwrite = false;
  if (ctx.has_input(2)) {
    const Tensor& flag = ctx.input(2);
    OT_CHECK(flag.dtype() == DType::kBool && flag.numel() == 1, ctx.node().context(),
             "overwrite_flag must be one bool, got ", dtype_name(flag.dtype()), shape_str(flag.shape()));
    overwrite = flag.data<bool>()[0];
  }
  ctx.output(0, DType::kBool, Shape{1}).data<bool>()[0] = true;
  if (!ctx.output_requested(1)) return;
  Tensor& out = ctx.output(1, buffer.dtype(), buffer.shape());
  dispatch_float(buffer.dtype(), [&]<typename T>() {
    const T* b = buffer.data<T>();
    const T* v = value.data<T>();
    T* o = out.data<T>();
    parallel_for(out.numel(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) o[i] = overwrite ? v[i] : T(compute_t<T>(b[i]) + compute_t<T>(v[i]));
    });
  });
}

}  // namespace

// An accumulation step after the gradient graph: nothing differentiates through it.
ONNXTRAIN_OP(InPlaceAccumulatorV2, kMsDomain, 1).inputs(2, 3).outputs(1, 2).shape(accumulator_shape)
    .inplace(1, 0).not_differentiable().cpu(accumulator_kernel);

}  // namespace onnxtrain
