// Portable fp32 convolution, with no library: the direct kernels of conv_direct.h with the
// channels-last copies, summand and activation of FusedConv around them.
// One source for both builds: the minimal build runs every convolution through it
// (conv_minimal.cc), the full build the small ones portable.h picks (conv_dnnl.cc), so a model of
// such convolutions (the digits CNN) trains to bit-identical parameters on either build.
#pragma once

#include <memory>
#include <string>

#include "backends/cpu/internal.h"
#include "backends/cpu/conv.h"

namespace onnxtrain::cpu {

// Forward convolution or transposed convolution of any ConvSpec with dtype kFloat32.
class PortableConv {
 public:
  OT_INTERNAL PortableConv(const ConvSpec& spec, const std::string& context);
  // As ConvPrimitive::run (fp32 pointers); z: the summand when spec.sum, a buffer other than y.
  OT_INTERNAL void run(const void* x, const void* w, const void* bias, void* y, const void* z) const;

  OT_INTERNAL PortableConv(PortableConv&&) noexcept;
  OT_INTERNAL PortableConv& operator=(PortableConv&&) noexcept;
  OT_INTERNAL ~PortableConv();

 private:
  struct Impl;
  std::unique_ptr<const Impl> impl_;  // unique: no shared_ptr control-block symbols (minimal size)
};

// dX and/or dW (and dB) of a plain, channels-first fp32 convolution.
class PortableConvBackward {
 public:
  OT_INTERNAL PortableConvBackward(const ConvSpec& spec, bool need_dx, bool need_dw, const std::string& context);
  OT_INTERNAL void run(const void* dy, const void* x, const void* w, void* dx, void* dw, void* db) const;

  OT_INTERNAL PortableConvBackward(PortableConvBackward&&) noexcept;
  OT_INTERNAL PortableConvBackward& operator=(PortableConvBackward&&) noexcept;
  OT_INTERNAL ~PortableConvBackward();

 private:
  struct Impl;
  std::unique_ptr<const Impl> impl_;  // unique: no shared_ptr control-block symbols (minimal size)
};

}  // namespace onnxtrain::cpu
