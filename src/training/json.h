// A small, strict JSON (RFC 8259) value, parser and emitter, for checkpoint headers.
//
//   json::Value v = json::parse(R"({"a": [1, 2.5, "x"]})");   // throws onnxtrain::Error
//   std::string s = json::dump(v);                            // compact, deterministic
//
// Strict means: one value and nothing but whitespace around it; no comments, trailing commas,
// NaN/Infinity, leading zeros, lone surrogates, control characters or invalid UTF-8 in strings;
// duplicate object keys are an error; nesting is limited (no stack overflow on hostile input).
// Objects keep their keys in insertion order, so dump(parse(dump(v))) == dump(v).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onnxtrain::json {

class Value {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, unique keys

  Value() = default;  // null
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);  // finite only (checked when dumped)
  static Value string(std::string s);
  static Value array(Array items = {});
  static Value object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_integer() const { return type_ == Type::kNumber && is_int_; }  // exact int64 literal
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Typed reads; a wrong type throws onnxtrain::Error naming the expected and actual type.
  bool as_bool() const;
  int64_t as_int() const;  // only for integer literals that fit int64
  double as_double() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Object access: find returns nullptr when absent; set replaces or appends; erase removes.
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
  bool erase(std::string_view key);
  // Array append.
  void push_back(Value value);

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  bool is_int_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  Array array_;
  Object object_;
};

const char* type_name(Value::Type type);

// Parses exactly one JSON value; errors are onnxtrain::Error(kInvalidModel) with the byte offset.
Value parse(std::string_view text, int max_depth = 64);
// Compact JSON (no whitespace). Throws for non-finite numbers and invalid UTF-8 in strings.
std::string dump(const Value& value);
// True when s is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s);

}  // namespace onnxtrain::json
