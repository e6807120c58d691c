// Forced into every translation unit of the WebAssembly build (cmake/web.cmake, -include): Debian's
// emscripten 3.1.6 ships libc++ 13, which lacks three C++20/17 library pieces the sources use.
//   std::bit_cast                 (libc++ 14): clang 14's __builtin_bit_cast, which it wraps anyway
//   std::to_chars(double)         (libc++ 14): the shortest "%.*g" form that reads back exactly
//   std::from_chars(double)       (libc++ 17): strtod over a bounded copy; no locale in WebAssembly
//   std::make_unique_for_overwrite (libc++ 16): new T[n] without value-initialisation
// Each is declared only when the library does not say it has it, so a newer emscripten uses its own.
#pragma once

#include <bit>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <type_traits>

#if defined(_LIBCPP_VERSION) && _LIBCPP_VERSION < 14000
namespace std {

template <class To, class From>
  requires(sizeof(To) == sizeof(From) && is_trivially_copyable_v<To> && is_trivially_copyable_v<From>)
constexpr To bit_cast(const From& from) noexcept {
  return __builtin_bit_cast(To, from);
}

inline to_chars_result to_chars(char* first, char* last, double value) {
  char buf[32];
  int n = 0;
  for (int precision = 1; precision <= 17; ++precision) {  // the shortest that round-trips
    n = snprintf(buf, sizeof buf, "%.*g", precision, value);
    if (strtod(buf, nullptr) == value) break;
  }
  if (n < 0 || n > last - first) return {last, errc::value_too_large};
  memcpy(first, buf, size_t(n));
  return {first + n, errc()};
}

inline from_chars_result from_chars(const char* first, const char* last, double& value) {
  // from_chars takes no leading '+' or whitespace; strtod would, and would read past `last`.
  if (first == last || *first == '+' || *first == ' ' || (last - first) > 400) return {first, errc::invalid_argument};
  std::string text(first, last);
  char* end = nullptr;
  errno = 0;
  const double parsed = strtod(text.c_str(), &end);
  if (end == text.c_str()) return {first, errc::invalid_argument};
  const char* ptr = first + (end - text.c_str());
  if (errno == ERANGE) return {ptr, errc::result_out_of_range};
  value = parsed;
  return {ptr, errc()};
}

template <class T>
  requires is_unbounded_array_v<T>
unique_ptr<T> make_unique_for_overwrite(size_t n) {
  return unique_ptr<T>(new remove_extent_t<T>[n]);
}

}  // namespace std
#endif
