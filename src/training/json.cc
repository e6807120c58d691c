#include "training/json.h"

#include <charconv>
#include <cmath>
#include <unordered_set>

#include "onnxtrain/status.h"

namespace onnxtrain::json {

// ---------------------------------------------------------------- Value

Value Value::boolean(bool b) { Value v; v.type_ = Type::kBool; v.bool_ = b; return v; }
Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::kNumber;
  v.is_int_ = true;
  v.int_ = i;
  v.double_ = double(i);
  return v;
}
Value Value::number(double d) { Value v; v.type_ = Type::kNumber; v.double_ = d; return v; }
Value Value::string(std::string s) { Value v; v.type_ = Type::kString; v.string_ = std::move(s); return v; }
Value Value::array(Array items) { Value v; v.type_ = Type::kArray; v.array_ = std::move(items); return v; }
Value Value::object() { Value v; v.type_ = Type::kObject; return v; }

const char* type_name(Value::Type type) {
  switch (type) {
    case Value::Type::kNull: return "null";
    case Value::Type::kBool: return "boolean";
    case Value::Type::kNumber: return "number";
    case Value::Type::kString: return "string";
    case Value::Type::kArray: return "array";
    case Value::Type::kObject: return "object";
  }
  return "?";
}

#define OT_JSON_EXPECT(t)                                                                   \
  if (type_ != Type::t)                                                                     \
  OT_THROW(kInvalidModel, "JSON: expected ", type_name(Type::t), ", got ", type_name(type_))

bool Value::as_bool() const { OT_JSON_EXPECT(kBool); return bool_; }
int64_t Value::as_int() const {
  OT_JSON_EXPECT(kNumber);
  if (!is_int_) OT_THROW(kInvalidModel, "JSON: expected an integer that fits in 64 bits, got a non-integral or out-of-range number");
  return int_;
}
double Value::as_double() const { OT_JSON_EXPECT(kNumber); return double_; }
const std::string& Value::as_string() const { OT_JSON_EXPECT(kString); return string_; }
const Value::Array& Value::as_array() const { OT_JSON_EXPECT(kArray); return array_; }
Value::Array& Value::as_array() { OT_JSON_EXPECT(kArray); return array_; }
const Value::Object& Value::as_object() const { OT_JSON_EXPECT(kObject); return object_; }
Value::Object& Value::as_object() { OT_JSON_EXPECT(kObject); return object_; }

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : as_object())
    if (k == key) return &v;
  return nullptr;
}

void Value::set(std::string key, Value value) {
  for (auto& [k, v] : as_object()) {
    if (k == key) { v = std::move(value); return; }
  }
  object_.emplace_back(std::move(key), std::move(value));
}

bool Value::erase(std::string_view key) {
  auto& obj = as_object();
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it->first == key) { obj.erase(it); return true; }
  }
  return false;
}

void Value::push_back(Value value) { as_array().push_back(std::move(value)); }

#undef OT_JSON_EXPECT

// ---------------------------------------------------------------- UTF-8

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when invalid.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return uint8_t(s[k]); };
  uint8_t c = byte(i);
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
  else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
  else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
  else return 0;
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    uint8_t cc = byte(i + k);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
  if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
  return len;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// ---------------------------------------------------------------- parser

namespace {

class Parser {
 public:
  Parser(std::string_view text, int max_depth) : s_(text), max_depth_(max_depth) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected data after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    std::string near;
    if (pos_ < s_.size()) {
      uint8_t c = uint8_t(s_[pos_]);
      near = (c >= 0x20 && c < 0x7F) ? std::string(" near '") + char(c) + "'"
                                     : " near byte 0x" + hex2(c);
    } else {
      near = " at end of input";
    }
    OT_THROW(kInvalidModel, "invalid JSON at byte ", pos_, near, ": ", what);
  }
  static std::string hex2(uint8_t c) {
    const char* digits = "0123456789abcdef";
    return {digits[c >> 4], digits[c & 15]};
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }

  void skip_ws() {
    while (!at_end()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') ++pos_;
      else break;
    }
  }

  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail("invalid literal");
    pos_ += lit.size();
  }

  Value parse_value(int depth) {
    if (at_end()) fail("expected a value");
    switch (peek()) {
      case '{': return parse_object(depth + 1);
      case '[': return parse_array(depth + 1);
      case '"': return Value::string(parse_string());
      case 't': expect_literal("true"); return Value::boolean(true);
      case 'f': expect_literal("false"); return Value::boolean(false);
      case 'n': expect_literal("null"); return Value();
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        fail("expected a value");
    }
  }

  Value parse_object(int depth) {
    if (depth > max_depth_) fail("nesting deeper than " + std::to_string(max_depth_));
    ++pos_;  // '{'
    Value obj = Value::object();
    std::unordered_set<std::string> keys;
    skip_ws();
    if (!at_end() && peek() == '}') { ++pos_; return obj; }
    while (true) {
      skip_ws();
      if (at_end() || peek() != '"') fail("expected a string key");
      size_t key_pos = pos_;
      std::string key = parse_string();
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        fail("duplicate key \"" + key + "\"");
      }
      skip_ws();
      if (at_end() || peek() != ':') fail("expected ':'");
      ++pos_;
      skip_ws();
      Value v = parse_value(depth);
      obj.as_object().emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (at_end()) fail("unterminated object");
      if (peek() == ',') { ++pos_; continue; }
      if (peek() == '}') { ++pos_; return obj; }
      fail("expected ',' or '}'");
    }
  }

  Value parse_array(int depth) {
    if (depth > max_depth_) fail("nesting deeper than " + std::to_string(max_depth_));
    ++pos_;  // '['
    Value arr = Value::array();
    skip_ws();
    if (!at_end() && peek() == ']') { ++pos_; return arr; }
    while (true) {
      skip_ws();
      arr.push_back(parse_value(depth));
      skip_ws();
      if (at_end()) fail("unterminated array");
      if (peek() == ',') { ++pos_; continue; }
      if (peek() == ']') { ++pos_; return arr; }
      fail("expected ',' or ']'");
    }
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[pos_ + k];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
      else fail("invalid \\u escape");
    }
    pos_ += 4;
    return v;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      uint8_t c = uint8_t(peek());
      if (c == '"') { ++pos_; return out; }
      if (c < 0x20) fail("control character in string (must be escaped)");
      if (c == '\\') {
        ++pos_;
        if (at_end()) fail("unterminated escape");
        char e = peek();
        ++pos_;
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            uint32_t cp = parse_hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (s_.substr(pos_, 2) != "\\u") fail("high surrogate not followed by a low surrogate");
              pos_ += 2;
              uint32_t lo = parse_hex4();
              if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            append_utf8(out, cp);
            break;
          }
          default: --pos_; fail("invalid escape");
        }
        continue;
      }
      if (c < 0x80) { out += char(c); ++pos_; continue; }
      size_t n = utf8_sequence_length(s_, pos_);
      if (n == 0) fail("invalid UTF-8 in string");
      out.append(s_.substr(pos_, n));
      pos_ += n;
    }
  }

  Value parse_number() {
    size_t start = pos_;
    auto digit = [&]() { return !at_end() && peek() >= '0' && peek() <= '9'; };
    bool integral = true;
    if (peek() == '-') ++pos_;
    if (!digit()) fail("expected a digit");
    if (peek() == '0') {
      ++pos_;
      if (digit()) fail("leading zeros are not allowed");
    } else {
      while (digit()) ++pos_;
    }
    if (!at_end() && peek() == '.') {
      integral = false;
      ++pos_;
      if (!digit()) fail("expected a digit after '.'");
      while (digit()) ++pos_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      integral = false;
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (!digit()) fail("expected a digit in the exponent");
      while (digit()) ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (integral) {
      int64_t i = 0;
      auto r = std::from_chars(first, last, i);
      if (r.ec == std::errc() && r.ptr == last) return Value::integer(i);
      // Out of int64 range: fall through to a (rounded) double.
    }
    double d = 0;
    auto r = std::from_chars(first, last, d);
    if (r.ec == std::errc::result_out_of_range) { pos_ = start; fail("number out of range"); }
    if (r.ec != std::errc() || r.ptr != last) { pos_ = start; fail("invalid number"); }
    return Value::number(d);
  }

  std::string_view s_;
  size_t pos_ = 0;
  int max_depth_;
};

void dump_string(std::string& out, const std::string& s) {
  if (!valid_utf8(s)) OT_THROW(kInvalidArgument, "JSON: string is not valid UTF-8: cannot write it");
  out += '"';
  for (char ch : s) {
    uint8_t c = uint8_t(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          const char* digits = "0123456789abcdef";
          out += "\\u00";
          out += digits[c >> 4];
          out += digits[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void dump_value(std::string& out, const Value& v) {
  switch (v.type()) {
    case Value::Type::kNull: out += "null"; break;
    case Value::Type::kBool: out += v.as_bool() ? "true" : "false"; break;
    case Value::Type::kNumber: {
      char buf[64];
      std::to_chars_result r;
      if (v.is_integer()) {
        r = std::to_chars(buf, buf + sizeof(buf), v.as_int());
      } else {
        double d = v.as_double();
        if (!std::isfinite(d)) OT_THROW(kInvalidArgument, "JSON: cannot write a non-finite number");
        r = std::to_chars(buf, buf + sizeof(buf), d);  // shortest round-trip form
      }
      std::string_view text(buf, size_t(r.ptr - buf));
      out += text;
      // "1e+20" and "0.5" are JSON; a bare "inf" cannot occur here. Keep doubles recognisable.
      if (!v.is_integer() && text.find_first_of(".eE") == std::string_view::npos) out += ".0";
      break;
    }
    case Value::Type::kString: dump_string(out, v.as_string()); break;
    case Value::Type::kArray: {
      out += '[';
      bool first = true;
      for (const Value& item : v.as_array()) {
        if (!first) out += ',';
        first = false;
        dump_value(out, item);
      }
      out += ']';
      break;
    }
    case Value::Type::kObject: {
      out += '{';
      bool first = true;
      for (const auto& [k, item] : v.as_object()) {
        if (!first) out += ',';
        first = false;
        dump_string(out, k);
        out += ':';
        dump_value(out, item);
      }
      out += '}';
      break;
    }
  }
}

}  // namespace

Value parse(std::string_view text, int max_depth) { return Parser(text, max_depth).parse_document(); }

std::string dump(const Value& value) {
  std::string out;
  dump_value(out, value);
  return out;
}

}  // namespace onnxtrain::json
