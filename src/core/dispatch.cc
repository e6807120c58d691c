#include "core/dispatch.h"

namespace onnxtrain::detail {

void unsupported_dtype(DType dt, const char* family) {
  OT_THROW(kNotImplemented, "dtype ", dtype_name(dt), " is not supported here (expected ", family,
           ")");
}

}  // namespace onnxtrain::detail
