// Optional values (opset 15+): Optional, OptionalHasElement, OptionalGetElement. An optional with
// an element is that element at run time (a tensor or a sequence); one without is Value::none().
#include "ops/common.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

bool has_element(const KernelContext& ctx, size_t i) {
  return i < ctx.num_inputs() && ctx.input_kind(i) != Value::Kind::kNone;
}

// Optional(x): x itself; Optional() (with its `type` attribute): an empty optional.
void optional_kernel(KernelContext& ctx) {
  ctx.set_output_value(0, has_element(ctx, 0) ? ctx.input_value(0) : Value::none());
}

void optional_rule(ShapeContext& ctx) {
  if (!ctx.has_input(0)) return;
  ValueInfo info = *ctx.input_info(0);
  info.kind = info.kind == ValueKind::kSequence || info.kind == ValueKind::kOptionalSequence
                  ? ValueKind::kOptionalSequence : ValueKind::kOptionalTensor;
  ctx.set_output_info(0, info);
}

void optional_has_element_kernel(KernelContext& ctx) {
  ctx.output(0, DType::kBool, {}).data<bool>()[0] = has_element(ctx, 0);
}

void optional_get_element_kernel(KernelContext& ctx) {
  OT_CHECK(has_element(ctx, 0), ctx.node().context(), "the optional input is empty");
  ctx.set_output_value(0, ctx.input_value(0));
}

// The element's type: a tensor or a sequence.
void optional_get_element_rule(ShapeContext& ctx) {
  if (!ctx.has_input(0)) return;
  ValueInfo info = *ctx.input_info(0);
  info.kind = info.kind == ValueKind::kSequence || info.kind == ValueKind::kOptionalSequence ? ValueKind::kSequence
                                                                                            : ValueKind::kTensor;
  ctx.set_output_info(0, info);
}

}  // namespace

// y = Optional(x) = x.  dx = dy
ONNXTRAIN_OP(Optional, kOnnxDomain, 15).inputs(0, 1).outputs(1).shape(optional_rule).cpu(optional_kernel)
    .gradient([](GradientBuilder& g) { g.set(0, g.dy(0)); });
ONNXTRAIN_OP(OptionalHasElement, kOnnxDomain, 15).inputs(0, 1).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, DType::kBool, Shape{}); })
    .not_differentiable().cpu(optional_has_element_kernel);
// y = the element of x.  dx = dy
ONNXTRAIN_OP(OptionalGetElement, kOnnxDomain, 15).inputs(1).outputs(1).shape(optional_get_element_rule)
    .cpu(optional_get_element_kernel).gradient([](GradientBuilder& g) { g.set(0, g.dy(0)); });

}  // namespace onnxtrain
