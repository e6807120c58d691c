// NonMaxSuppression (opset 10, 11): per batch and class, greedily keeps the highest-scoring boxes
// whose score passes score_threshold and whose IoU with every box already kept is at most
// iou_threshold, up to max_output_boxes_per_class per class. Boxes are [y1, x1, y2, x2] with any
// pair of diagonal corners (center_point_box = 0) or [x_center, y_center, width, height]
// (center_point_box = 1). The output lists [batch, class, box] triples, batch-major, then class,
// then selection order (score descending, lower box index first on ties).
#include <algorithm>
#include <numeric>

#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

struct Box {
  double y1, x1, y2, x2, area;
};

Box make_box(const double* b, bool center) {
  Box r;
  if (center) {
    double xc = b[0], yc = b[1], w = b[2], h = b[3];
    r.x1 = xc - w / 2;
    r.x2 = xc + w / 2;
    r.y1 = yc - h / 2;
    r.y2 = yc + h / 2;
  } else {
    r.y1 = std::min(b[0], b[2]);
    r.y2 = std::max(b[0], b[2]);
    r.x1 = std::min(b[1], b[3]);
    r.x2 = std::max(b[1], b[3]);
  }
  if (r.x1 > r.x2) std::swap(r.x1, r.x2);
  if (r.y1 > r.y2) std::swap(r.y1, r.y2);
  r.area = (r.x2 - r.x1) * (r.y2 - r.y1);
  return r;
}

// True when the IoU of a and b exceeds the threshold; degenerate boxes never suppress.
bool suppresses(const Box& a, const Box& b, double iou_threshold) {
  if (a.area <= 0 || b.area <= 0) return false;
  double ih = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
  double iw = std::min(a.x2, b.x2) - std::max(a.x1, b.x1);
  if (ih <= 0 || iw <= 0) return false;
  double inter = ih * iw;
  double uni = a.area + b.area - inter;
  if (uni <= 0) return false;
  return inter / uni > iou_threshold;
}

void nms_shape(ShapeContext& ctx) { ctx.set_output(0, DType::kInt64, Shape{-1, 3}); }

void nms_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& boxes = ctx.input(0);
  const Tensor& scores = ctx.input(1);
  OT_CHECK(boxes.rank() == 3 && boxes.dim(2) == 4, node.context(),
           "boxes must be [num_batches, spatial_dimension, 4], got ", shape_str(boxes.shape()));
  OT_CHECK(scores.rank() == 3, node.context(), "scores must be [num_batches, num_classes, spatial_dimension], got ",
           shape_str(scores.shape()));
  OT_CHECK(scores.dim(0) == boxes.dim(0) && scores.dim(2) == boxes.dim(1), node.context(), "scores ",
           shape_str(scores.shape()), " do not match boxes ", shape_str(boxes.shape()));
  OT_CHECK(is_floating(boxes.dtype()) && is_floating(scores.dtype()), node.context(),
           "boxes and scores must be floating-point, got ", dtype_name(boxes.dtype()), " and ",
           dtype_name(scores.dtype()));
  auto scalar = [&](size_t i, const char* what) -> const Tensor* {
    if (!ctx.has_input(i)) return nullptr;
    const Tensor& t = ctx.input(i);
    OT_CHECK(t.numel() == 1, node.context(), what, " must hold one value, got shape ", shape_str(t.shape()));
    return &t;
  };
  int64_t max_out = 0;
  if (const Tensor* t = scalar(2, "max_output_boxes_per_class")) max_out = t->item_as_int(0);
  double iou_threshold = 0;
  if (const Tensor* t = scalar(3, "iou_threshold")) iou_threshold = double(float(t->item_as_double(0)));
  bool use_score = false;
  double score_threshold = 0;
  if (const Tensor* t = scalar(4, "score_threshold")) {
    use_score = true;
    score_threshold = double(float(t->item_as_double(0)));
  }
  int64_t center = node.attr_int("center_point_box", 0);
  OT_CHECK(center == 0 || center == 1, node.context(), "center_point_box must be 0 or 1, got ", center);

  const int64_t nb = boxes.dim(0), nc = scores.dim(1), ns = boxes.dim(1);
  std::vector<int64_t> selected;  // triples
  if (max_out > 0 && ns > 0) {
    std::vector<double> bv(size_t(boxes.numel())), sv(size_t(scores.numel()));
    for (int64_t i = 0; i < boxes.numel(); ++i) bv[size_t(i)] = boxes.item_as_double(i);
    for (int64_t i = 0; i < scores.numel(); ++i) sv[size_t(i)] = double(float(scores.item_as_double(i)));
    std::vector<Box> bx(static_cast<size_t>(ns));
    std::vector<int64_t> order, kept;
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t i = 0; i < ns; ++i) bx[size_t(i)] = make_box(&bv[size_t((b * ns + i) * 4)], center == 1);
      for (int64_t c = 0; c < nc; ++c) {
        const double* s = &sv[size_t((b * nc + c) * ns)];
        order.clear();
        for (int64_t i = 0; i < ns; ++i)
          if (!use_score || s[i] > score_threshold) order.push_back(i);
        std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return s[x] > s[y]; });
        kept.clear();
        for (int64_t i : order) {
          if (int64_t(kept.size()) >= max_out) break;
          bool ok = true;
          for (int64_t k : kept)
            if (suppresses(bx[size_t(k)], bx[size_t(i)], iou_threshold)) { ok = false; break; }
          if (!ok) continue;
          kept.push_back(i);
          selected.insert(selected.end(), {b, c, i});
        }
      }
    }
  }
  Tensor& y = ctx.output(0, DType::kInt64, Shape{int64_t(selected.size() / 3), 3});
  std::copy(selected.begin(), selected.end(), y.data<int64_t>());
}

}  // namespace

// Outputs are box indices: no gradient flows.
ONNXTRAIN_OP(NonMaxSuppression, kOnnxDomain, 10).inputs(2, 5).outputs(1).shape(nms_shape).not_differentiable()
    .cpu(nms_kernel);

}  // namespace onnxtrain
