// oneDNN glue shared by the CPU kernels: one engine, a stream per thread, memory-descriptor
// helpers, dnnl::error -> onnxtrain::Error, and a small per-kernel primitive cache keyed by shape.
// Only .cc files under src/ include this header (oneDNN is a private dependency).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <initializer_list>
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
// [N, C, spatial...] stored channels last (NHWC for 2-d): C varies fastest.
dnnl::memory::desc channels_last_md(const dnnl::memory::dims& dims, dnnl::memory::data_type dt);
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

// primitive.execute(stream, args) without the std::unordered_map the C++ API takes (and turns into
// an array) per call: small primitives run thousands of times a second.
inline void execute(const dnnl::primitive& primitive, dnnl::stream& strm,
                    std::initializer_list<dnnl_exec_arg_t> args) {
  dnnl::error::wrap_c_api(dnnl_primitive_execute(primitive.get(), strm.get(), int(args.size()), args.begin()),
                          "could not execute a primitive");
}

// One primitive argument whose layout the primitive chose (blocked, e.g. nChw16c): when it differs
// from the plain ONNX layout, a buffer in the primitive's layout and the reorder between the two.
// Blocked layouts are what make oneDNN's JIT kernels fast; reordering costs one pass (or none,
// for constant data, through read_constant).
struct Relayout {
  dnnl::memory::desc user, prim;
  bool needed = false;
  // Whether one caller at a time uses this (a primitive a kernel owns: the executor runs a plan on
  // one thread at a time): then the memory over the caller's data is made once and re-pointed each
  // call (set_data_handle), where a fresh dnnl::memory per argument per call was about a
  // microsecond of a batch-1 convolution's 20. Otherwise concurrent reads that need no reorder
  // stay safe (a matmul run by several threads at once).
  bool single_caller = false;
  dnnl::reorder reorder;
  mutable dnnl::memory buffer;
  mutable const void* cached = nullptr;  // the constant data `buffer` holds, for read_constant
  mutable dnnl::memory at_user;          // single_caller: `user` over the last call's data

  // `to_prim`: the primitive reads this argument (reorder user -> prim); else it writes it.
  Relayout(const dnnl::memory::desc& user_md, const dnnl::memory::desc& prim_md, bool to_prim,
           bool one_caller = false)
      : user(user_md), prim(prim_md), needed(user_md != prim_md), single_caller(one_caller) {
    if (!needed) return;
    auto& eng = dnnl_engine();
    buffer = dnnl::memory(prim, eng);
    reorder = to_prim ? dnnl::reorder(dnnl::reorder::primitive_desc(eng, user, eng, prim))
                      : dnnl::reorder(dnnl::reorder::primitive_desc(eng, prim, eng, user));
  }
  Relayout() = default;

  // `user` over `data`.
  dnnl::memory user_memory(const void* data) const {
    if (!single_caller) return dnnl::memory(user, dnnl_engine(), const_cast<void*>(data));
    if (!at_user) at_user = dnnl::memory(user, dnnl_engine(), const_cast<void*>(data));
    else at_user.set_data_handle(const_cast<void*>(data));
    return at_user;
  }
  // The memory a primitive reads: `data` itself, or its copy in the primitive's layout.
  dnnl::memory read(const void* data, dnnl::stream& strm) const {
    dnnl::memory m = user_memory(data);
    if (!needed) return m;
    execute(reorder, strm, {{DNNL_ARG_FROM, m.get()}, {DNNL_ARG_TO, buffer.get()}});
    return buffer;
  }
  // read() for data that never changes at this address (initializers): reordered once.
  dnnl::memory read_constant(const void* data, dnnl::stream& strm) const {
    if (!needed || cached != data) {
      dnnl::memory m = read(data, strm);
      cached = data;
      return m;
    }
    return buffer;
  }
  // The memory a primitive writes; finish_write() then moves it to `data` when it was a buffer.
  dnnl::memory write(void* data) const { return needed ? buffer : user_memory(data); }
  void finish_write(void* data, dnnl::stream& strm) const {
    if (!needed) return;
    execute(reorder, strm, {{DNNL_ARG_FROM, buffer.get()}, {DNNL_ARG_TO, user_memory(data).get()}});
  }
};

}  // namespace onnxtrain::cpu
