// Convolution in the minimal build: every spec through the portable im2col kernels
// (conv_portable.h), fp32 only (matmul_native() says no to the half types here, so the kernels
// widen them first).
#include "backends/cpu/conv.h"
#include "backends/cpu/conv_portable.h"

namespace onnxtrain::cpu {

struct ConvPrimitive::Impl {
  PortableConv conv;
};

ConvPrimitive::ConvPrimitive(const ConvSpec& spec, const std::string& context)
    : impl_(std::make_shared<Impl>(Impl{PortableConv(spec, context)})) {}

void ConvPrimitive::run(const void* x, const void* w, const void* bias, void* y, bool, const void* z) const {
  impl_->conv.run(x, w, bias, y, z);
}

struct ConvBackwardPrimitive::Impl {
  PortableConvBackward conv;
};

ConvBackwardPrimitive::ConvBackwardPrimitive(const ConvSpec& spec, bool need_dx, bool need_dw,
                                             const std::string& context)
    : impl_(std::make_shared<Impl>(Impl{PortableConvBackward(spec, need_dx, need_dw, context)})) {}

void ConvBackwardPrimitive::run(const void* dy, const void* x, const void* w, void* dx, void* dw, void* db) const {
  impl_->conv.run(dy, x, w, dx, dw, db);
}

}  // namespace onnxtrain::cpu
