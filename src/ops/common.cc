#include "ops/common.h"

#include <cstdio>
#include <mutex>
#include <set>

#include "core/parallel.h"

namespace onnxtrain {

int64_t normalize_axis(const Node& node, int64_t axis, int64_t rank) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max<int64_t>(rank, 1))
    OT_THROW(kInvalidArgument, node.context(), "axis ", axis, " is out of range for rank ", rank);
  return a;
}

std::vector<int64_t> normalize_axes(const Node& node, std::vector<int64_t> axes, int64_t rank) {
  for (auto& a : axes) a = normalize_axis(node, a, rank);
  return axes;
}

Shape broadcast_shapes(const Node& node, const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t j = 0; j < rank; ++j) {
    int64_t da = j < a.size() ? a[a.size() - 1 - j] : 1;
    int64_t db = j < b.size() ? b[b.size() - 1 - j] : 1;
    if (da != db && da != 1 && db != 1)
      OT_THROW(kInvalidArgument, node.context(), "shapes ", shape_str(a), " and ", shape_str(b),
               " cannot be broadcast together");
    out[rank - 1 - j] = da == 1 ? db : da;
  }
  return out;
}

std::optional<Shape> broadcast_static(const std::optional<Shape>& a, const std::optional<Shape>& b) {
  if (!a || !b) return std::nullopt;
  size_t rank = std::max(a->size(), b->size());
  Shape out(rank);
  for (size_t j = 0; j < rank; ++j) {
    int64_t da = j < a->size() ? (*a)[a->size() - 1 - j] : 1;
    int64_t db = j < b->size() ? (*b)[b->size() - 1 - j] : 1;
    int64_t d;
    if (da == 1) d = db;
    else if (db == 1) d = da;
    else if (da == -1 || db == -1) d = da == -1 ? (db == -1 ? -1 : db) : da;
    else d = da;  // equal, or a mismatch the kernel will report with full context
    out[rank - 1 - j] = d;
  }
  return out;
}

std::vector<int64_t> strides_of(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

void shape_same_as_input(ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0)); }

void shape_broadcast_inputs(ShapeContext& ctx) {
  std::optional<Shape> s = ctx.input_shape(0);
  for (size_t i = 1; i < ctx.num_inputs(); ++i) s = broadcast_static(s, ctx.input_shape(i));
  ctx.set_output(0, ctx.input_dtype(0), s);
}

void shape_broadcast_to_bool(ShapeContext& ctx) {
  ctx.set_output(0, DType::kBool, broadcast_static(ctx.input_shape(0), ctx.input_shape(1)));
}

std::vector<int64_t> int_list_input(const KernelContext& ctx, size_t i) {
  if (!ctx.has_input(i)) return {};
  const Tensor& t = ctx.input(i);
  OT_CHECK(t.dtype() == DType::kInt64 || t.dtype() == DType::kInt32, ctx.node().context(), "input ", i,
           " should be int64, got ", dtype_name(t.dtype()));
  return t.to_int_vector();
}

Tensor widen_to_fp32(const Tensor& t) {
  Tensor out = Tensor::empty(DType::kFloat32, t.shape());
  dispatch_float(t.dtype(), [&]<typename T>() {
    const T* src = t.data<T>();
    float* dst = out.data<float>();
    parallel_for(t.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = float(src[i]);
    });
  });
  return out;
}

void narrow_from_fp32(const Tensor& fp32, Tensor& half) {
  dispatch_float(half.dtype(), [&]<typename T>() {
    const float* src = fp32.data<float>();
    T* dst = half.data<T>();
    parallel_for(half.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = T(src[i]);
    });
  });
}

void note_half_through_fp32(const char* kernel, DType dt) {
  static std::mutex mutex;
  static std::set<std::pair<std::string, DType>> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (!said.insert({kernel, dt}).second) return;
  std::fprintf(stderr, "onnxtrain: this CPU has no native %s %s kernel (see onnxtrain.cpu_features()); "
               "%s %ss compute through fp32\n", dtype_name(dt).c_str(), kernel, dtype_name(dt).c_str(), kernel);
}

}  // namespace onnxtrain
