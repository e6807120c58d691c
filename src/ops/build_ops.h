// Which ops this build left out: a minimal build (-DONNXTRAIN_MINIMAL=ON) compiles only the op files
// its ONNXTRAIN_OPS / ONNXTRAIN_OPS_FILE select, so an unknown op may be one it could have had.
#pragma once

#include <string>

namespace onnxtrain {

// True when a file this build left out registers op_type (any domain): the full build leaves
// none out (build_ops.cc), a minimal build lists them in its generated build_ops.cc.
bool op_left_out_of_build(const std::string& op_type);

// How to add an op to the build, for error messages.
inline constexpr const char* kAddOpHint =
    "rebuild the minimal runtime with the op added to -DONNXTRAIN_OPS (or to the ops file given as "
    "-DONNXTRAIN_OPS_FILE; `onnxtrain artifacts` writes one, ops.txt, listing what the artifacts need)";

}  // namespace onnxtrain
