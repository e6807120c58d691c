// Value: what one ONNX value holds at run time. Most values are tensors; ONNX also has
// sequence(tensor) and optional(T) types, which SequenceConstruct/SplitToSequence, Optional and
// control flow carrying them produce. An optional with an element is that element (a tensor or a
// sequence); an optional without one is kNone.
#pragma once

#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

struct Value {
  enum class Kind { kTensor, kSequence, kNone };
  Kind kind = Kind::kTensor;
  Tensor tensor;                  // kTensor
  std::vector<Tensor> sequence;   // kSequence (may be empty)

  Value() = default;
  Value(Tensor t) : tensor(std::move(t)) {}  // NOLINT: a tensor is a value
  static Value of_sequence(std::vector<Tensor> items) {
    Value v;
    v.kind = Kind::kSequence;
    v.sequence = std::move(items);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  bool is_tensor() const { return kind == Kind::kTensor; }
  bool is_sequence() const { return kind == Kind::kSequence; }
  bool is_none() const { return kind == Kind::kNone; }
};

// "tensor", "sequence" or "none", for messages.
inline const char* value_kind_name(Value::Kind k) {
  return k == Value::Kind::kTensor ? "a tensor" : k == Value::Kind::kSequence ? "a sequence" : "an empty optional";
}

}  // namespace onnxtrain
