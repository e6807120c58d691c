// The names of the mixed-precision modes, apart from the pass itself: the minimal runtime has no
// mixed-precision pass but its C API still checks a mode it is given.
#include "onnxtrain/status.h"
#include "passes/mixed_precision.h"

namespace onnxtrain {

DType mixed_precision_dtype(const std::string& name) {
  if (name.empty() || name == "none") return DType::kUndefined;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  OT_THROW(kInvalidArgument, "mixed_precision: unknown value '", name, "'; expected \"bf16\", \"fp16\" or none");
}

std::string mixed_precision_name(DType low) {
  switch (low) {
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
    case DType::kUndefined: return "";
    default: OT_THROW(kInvalidArgument, "mixed precision: ", dtype_name(low), " is not a low-precision type");
  }
}

}  // namespace onnxtrain
