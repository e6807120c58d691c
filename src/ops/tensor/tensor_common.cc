// Helpers shared by the tensor-manipulation ops (see tensor_ops.h).
#include <algorithm>

#include "ops/tensor/tensor_ops.h"

#include "ops/gradient_builder.h"

namespace onnxtrain::tensor_ops {

std::optional<std::vector<int64_t>> attr_or_input_ints(const KernelContext& ctx, const char* attr, int input) {
  if (attr && ctx.node().has_attr(attr)) return ctx.node().attr_ints(attr);
  if (input >= 0 && ctx.has_input(size_t(input))) return int_list_input(ctx, size_t(input));
  return std::nullopt;
}

StaticInts static_ints(const ShapeContext& ctx, const char* attr, int input) {
  StaticInts r;
  if (attr && ctx.node().has_attr(attr)) {
    r.value = ctx.node().attr_ints(attr);
  } else if (input >= 0 && ctx.node().has_input(size_t(input))) {
    const Tensor* v = ctx.input_value(size_t(input));
    if (v) r.value = v->to_int_vector();
    else r.known = false;
  }
  return r;
}

int64_t scalar_int_input(const KernelContext& ctx, size_t i, const char* what) {
  const Tensor& t = ctx.input(i);
  OT_CHECK(t.numel() == 1, ctx.node().context(), what, " should be a scalar, got shape ", shape_str(t.shape()));
  OT_CHECK(is_integer(t.dtype()), ctx.node().context(), what, " should be an integer, got ", dtype_name(t.dtype()));
  return t.item_as_int(0);
}

void check_index_dtype(const KernelContext& ctx, const Tensor& t, const char* what) {
  OT_CHECK(t.dtype() == DType::kInt64 || t.dtype() == DType::kInt32, ctx.node().context(), what,
           " should be int32 or int64, got ", dtype_name(t.dtype()));
}

template <typename T>
void strided_copy(const T* in, T* out, const Shape& out_shape, const std::vector<int64_t>& in_strides,
                  int64_t base) {
  int64_t total = numel(out_shape);
  if (total == 0) return;
  // Collapse: drop size-1 dims, merge a dim into the previous one when addressing stays linear.
  std::vector<int64_t> dims, st;
  for (size_t d = 0; d < out_shape.size(); ++d) {
    if (out_shape[d] == 1) continue;
    if (!dims.empty() && st.back() == in_strides[d] * out_shape[d]) {
      dims.back() *= out_shape[d];
      st.back() = in_strides[d];
    } else {
      dims.push_back(out_shape[d]);
      st.push_back(in_strides[d]);
    }
  }
  if (dims.empty()) {
    out[0] = in[base];
    return;
  }
  const int64_t inner = dims.back(), s = st.back();
  const int64_t outer = total / inner;
  const size_t r = dims.size() - 1;
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / inner);
  parallel_for(outer, grain, [&](int64_t b, int64_t e) {
    std::vector<int64_t> idx(r, 0);
    int64_t off = base, rem = b;
    for (size_t d = r; d-- > 0;) {
      idx[d] = rem % dims[d];
      rem /= dims[d];
      off += idx[d] * st[d];
    }
    for (int64_t row = b; row < e; ++row) {
      T* o = out + row * inner;
      const T* src = in + off;
      if (s == 1) std::memcpy(o, src, size_t(inner) * sizeof(T));
      else if (s == 0) std::fill_n(o, inner, *src);
      else for (int64_t i = 0; i < inner; ++i) o[i] = src[i * s];
      for (size_t d = r; d-- > 0;) {
        off += st[d];
        if (++idx[d] < dims[d]) break;
        off -= st[d] * dims[d];
        idx[d] = 0;
      }
    }
  });
}

template void strided_copy<uint8_t>(const uint8_t*, uint8_t*, const Shape&, const std::vector<int64_t>&, int64_t);
template void strided_copy<uint16_t>(const uint16_t*, uint16_t*, const Shape&, const std::vector<int64_t>&, int64_t);
template void strided_copy<uint32_t>(const uint32_t*, uint32_t*, const Shape&, const std::vector<int64_t>&, int64_t);
template void strided_copy<uint64_t>(const uint64_t*, uint64_t*, const Shape&, const std::vector<int64_t>&, int64_t);

void strided_copy(const Tensor& in, Tensor& out, const Shape& out_shape, const std::vector<int64_t>& in_strides,
                  int64_t base) {
  dispatch_by_size(in.dtype(), [&]<typename T>() {
    strided_copy<T>(static_cast<const T*>(in.data()), static_cast<T*>(out.data()), out_shape, in_strides, base);
  });
}

void shape_from_input1(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  if (const Tensor* s = ctx.input_value(1)) return ctx.set_output(0, dt, s->to_int_vector());
  const auto& ss = ctx.input_shape(1);
  if (ss && ss->size() == 1 && (*ss)[0] >= 0) return ctx.set_output(0, dt, Shape(size_t((*ss)[0]), -1));
  ctx.set_output(0, dt);
}

#if ONNXTRAIN_GRADIENT_RULES
std::string reshape_like(GradientBuilder& g, const std::string& a, const std::string& like) {
  return g.emit("Reshape", {a, g.shape(like)}, {{"allowzero", Attribute::of(int64_t(1))}});
}

std::string ints_attr_or_input(GradientBuilder& g, const char* attr, int input) {
  if (attr && g.node().has_attr(attr)) return g.ints(g.node().attr_ints(attr));
  if (input >= 0 && g.has_input(size_t(input))) return g.x(size_t(input));
  return "";
}

std::string dim_of(GradientBuilder& g, const std::string& like, int64_t axis) {
  GraphBuilder::Attrs attrs{{"start", Attribute::of(axis)}};
  if (axis != -1) attrs["end"] = Attribute::of(axis + 1);
  return g.emit("Shape", {like}, attrs);
}
#endif  // ONNXTRAIN_GRADIENT_RULES

}  // namespace onnxtrain::tensor_ops
