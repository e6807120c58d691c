// oneDNN glue shared by the CPU kernels: one engine, a stream per thread, memory-descriptor
// helpers, dnnl::error -> onnxtrain::Error, and a small per-kernel primitive cache keyed by shape.
// Only .cc files under src/ include this header (oneDNN is a private dependency).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/shape_cache.h"
#include "onnxtrain/status.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::cpu {

dnnl::engine& dnnl_engine();
// In-order CPU stream of the calling thread (sessions may run on several threads).
dnnl::stream& dnnl_stream();

inline dnnl::memory::dims to_dims(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }

// Row-major (plain) descriptor of a shape.
dnnl::memory::desc plain_md(const dnnl::memory::dims& dims, dnnl::memory::data_type dt);
// Descriptor with explicit strides (transposed views without copies).
dnnl::memory::desc strided_md(const dnnl::memory::dims& dims, dnnl::memory::data_type dt,
                              const dnnl::memory::dims& strides);

// Throws onnxtrain::Error(kRuntime) naming the context and what failed.
[[noreturn]] void throw_dnnl_error(const dnnl::error& e, const std::string& context, const char* what);

// Runs f(), turning a dnnl::error into an onnxtrain::Error with the given context.
template <typename F>
decltype(auto) dnnl_guard(const std::string& context, const char* what, F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw_dnnl_error(e, context, what);
  }
}

}  // namespace onnxtrain::cpu
