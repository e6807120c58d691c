// What the C API's opaque handles hold, and the one wrapper every entry point runs its body in:
// `guard` turns any exception into an OtStatus and this thread's last error, so nothing C++
// crosses the C boundary.
//
// Handles share ownership of what they are built on (a module holds its checkpoint's state, an
// optimizer its module), so C callers may release them in any order. Members are declared in
// dependency order: the C++ objects holding references are destroyed before what they refer to.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "onnxtrain/artifacts.h"
#include "onnxtrain/c_api.h"
#include "onnxtrain/module.h"
#include "onnxtrain/session.h"

struct OtTensor {
  onnxtrain::Tensor tensor;
};

struct OtCheckpoint {
  std::shared_ptr<onnxtrain::CheckpointState> state;
};

struct OtModule {
  std::shared_ptr<onnxtrain::CheckpointState> state;
  std::shared_ptr<onnxtrain::Module> module;
  // Names handed out as const char*, kept for the handle's lifetime.
  std::vector<std::string> train_inputs, train_outputs, eval_inputs, eval_outputs;
  bool has_eval = false;
};

struct OtOptimizer {
  std::shared_ptr<onnxtrain::CheckpointState> state;
  std::shared_ptr<onnxtrain::Module> module;
  std::shared_ptr<onnxtrain::Optimizer> optimizer;
};

struct OtLRScheduler {
  std::shared_ptr<onnxtrain::CheckpointState> state;
  std::shared_ptr<onnxtrain::Module> module;
  std::shared_ptr<onnxtrain::Optimizer> optimizer;
  std::unique_ptr<onnxtrain::LRScheduler> scheduler;
};

struct OtArtifactOptions {
  onnxtrain::ArtifactOptions options;
};

struct OtInferenceSession {
  std::unique_ptr<onnxtrain::InferenceSession> session;
  std::vector<std::string> inputs, outputs;
};

namespace onnxtrain::capi {

// One C entry point's checks; failures throw kInvalidArgument naming the function and argument.
class Call {
 public:
  explicit Call(const char* function) : function_(function) {}
  const char* function() const { return function_; }

  // The object behind a handle the caller must pass.
  template <typename T>
  T& ref(T* handle, const char* what) const {
    if (!handle) null_argument(what);
    return *handle;
  }
  const char* str(const char* s, const char* what) const {
    if (!s) null_argument(what);
    return s;
  }
  // An output pointer the caller must pass; a handle output is cleared first, so a failed call
  // leaves NULL there.
  template <typename T>
  T*& out(T** p, const char* what) const {
    if (!p) null_argument(what);
    *p = nullptr;
    return *p;
  }
  // A list of `n` names (NULL allowed when n is 0).
  std::vector<std::string> names(const char* const* list, size_t n, const char* what) const;
  // Caller memory as a tensor without copying; checks dtype, shape and data pointer.
  Tensor borrow(const void* data, OtDType dtype, const int64_t* shape, size_t rank, const std::string& what) const;
  // Output handles for a step or run: checks the caller's array and count before anything runs.
  void check_outputs(OtTensor** outputs, size_t num_outputs, size_t expected) const;
  static void hand_out(std::vector<Tensor> results, OtTensor** outputs);

  [[noreturn]] void fail(const std::string& message) const;

 private:
  [[noreturn]] void null_argument(const char* what) const;
  const char* function_;
};

DType dtype_from_c(OtDType dtype, const std::string& what);

void clear_last_error() noexcept;
// Maps the exception being handled to a status and records its message as the last error.
OtStatus status_of_current_exception() noexcept;

// Runs body(call) for the C entry point `function`: OT_OK, or the status of what it threw.
template <typename F>
OtStatus guard(const char* function, F&& body) noexcept {
  clear_last_error();
  try {
    Call call(function);
    body(call);
    return OT_OK;
  } catch (...) {
    return status_of_current_exception();
  }
}

}  // namespace onnxtrain::capi
