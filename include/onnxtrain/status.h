// Errors. Inside the library failures are thrown as onnxtrain::Error; the C API turns them into
// status codes. Messages carry context: "[OpType] node 'name': what was expected, what came".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace onnxtrain {

enum class ErrorCode {
  kInvalidArgument = 1,  // bad input from the caller: feeds, shapes, dtypes, attributes
  kInvalidModel,         // malformed, truncated or inconsistent model files
  kNotImplemented,       // a capability we do not have yet, named
  kRuntime,              // a failure while running (I/O, library errors)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace onnxtrain

// OT_CHECK(cond, parts...): throws kInvalidArgument with the concatenated parts when cond fails.
#define OT_CHECK(cond, ...)                                                                     \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ::onnxtrain::Error(::onnxtrain::ErrorCode::kInvalidArgument,                       \
                               ::onnxtrain::detail::concat(__VA_ARGS__));                      \
  } while (0)

#define OT_THROW(code, ...) \
  throw ::onnxtrain::Error(::onnxtrain::ErrorCode::code, ::onnxtrain::detail::concat(__VA_ARGS__))
