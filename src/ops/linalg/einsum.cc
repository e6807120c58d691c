// Einsum: parses the equation (explicit or implicit output, ellipsis broadcasting), takes
// diagonals of repeated labels, sums labels nothing else needs, and contracts operands left to
// right as batched matmuls ([batch, M, K] x [batch, K, N]) through the shared MatMul path.
#include <algorithm>
#include <map>
#include <set>

#include "ops/gradient_builder.h"
#include "backends/cpu/gemm.h"
#include "ops/common.h"
#include "ops/linalg/matmul_util.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

constexpr int kEllipsisBase = 1000;  // labels of ellipsis dims: 1000 + position

struct Equation {
  std::vector<std::vector<int>> inputs;  // labels per operand, ellipsis expanded
  std::vector<int> output;
};

// Parses one term into labels; the ellipsis expands to `ell` labels right-aligned to `max_ell`.
std::vector<int> parse_term(const Node& node, const std::string& term, int64_t rank, int64_t max_ell, bool is_output,
                            int64_t* ell_out) {
  std::vector<int> labels;
  size_t dots = term.find("...");
  int64_t letters = 0;
  for (char ch : term)
    if (ch != '.') {
      OT_CHECK(std::isalpha(static_cast<unsigned char>(ch)), node.context(), "invalid character '", ch,
               "' in the equation");
      ++letters;
    }
  OT_CHECK(dots == std::string::npos || term.find("...", dots + 3) == std::string::npos, node.context(),
           "at most one ellipsis per term");
  int64_t ell = dots == std::string::npos ? 0 : (is_output ? max_ell : rank - letters);
  OT_CHECK(ell >= 0 && (dots != std::string::npos || is_output || letters == rank), node.context(), "term '", term,
           "' does not match an operand of rank ", rank);
  if (ell_out) *ell_out = ell;
  for (size_t i = 0; i < term.size();) {
    if (term.compare(i, 3, "...") == 0) {
      for (int64_t e = 0; e < ell; ++e) labels.push_back(kEllipsisBase + int(max_ell - ell + e));
      i += 3;
    } else {
      OT_CHECK(term[i] != '.', node.context(), "a lone '.' in the equation");
      labels.push_back(term[i]);
      ++i;
    }
  }
  return labels;
}

std::string strip(const std::string& s) {
  std::string r;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) r += c;
  return r;
}

Equation parse_equation(const Node& node, const std::string& eq_in, const std::vector<Shape>& shapes) {
  std::string eq = strip(eq_in);
  size_t arrow = eq.find("->");
  std::string lhs = arrow == std::string::npos ? eq : eq.substr(0, arrow);
  std::vector<std::string> terms;
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  OT_CHECK(terms.size() == shapes.size(), node.context(), "the equation has ", terms.size(), " operands, got ",
           shapes.size(), " inputs");
  int64_t max_ell = 0;
  std::vector<int64_t> ells(terms.size());
  Equation e;
  for (size_t i = 0; i < terms.size(); ++i) {
    parse_term(node, terms[i], int64_t(shapes[i].size()), 0, false, &ells[i]);
    max_ell = std::max(max_ell, ells[i]);
  }
  for (size_t i = 0; i < terms.size(); ++i)
    e.inputs.push_back(parse_term(node, terms[i], int64_t(shapes[i].size()), max_ell, false, nullptr));
  if (arrow != std::string::npos) {
    e.output = parse_term(node, eq.substr(arrow + 2), 0, max_ell, true, nullptr);
  } else {
    for (int64_t j = 0; j < max_ell; ++j) e.output.push_back(kEllipsisBase + int(j));
    std::map<int, int> count;
    for (auto& t : e.inputs)
      for (int l : t) count[l]++;
    for (auto [l, c] : count)
      if (l < kEllipsisBase && c == 1) e.output.push_back(l);
  }
  std::set<int> seen;
  for (int l : e.output) {
    OT_CHECK(seen.insert(l).second, node.context(), "output label repeated in '", eq_in, "'");
    bool found = false;
    for (auto& t : e.inputs) found = found || std::find(t.begin(), t.end(), l) != t.end();
    OT_CHECK(found || l >= kEllipsisBase, node.context(), "output label '", char(l), "' is in no input");
  }
  return e;
}

// A working tensor: contiguous data with one label per dim.
template <typename W>
struct LT {
  std::vector<W> data;
  Shape shape;
  std::vector<int> labels;
};

// dst[idx] = src[sum idx_d * strides_d] over out_shape (diagonals, permutations).
template <typename W>
std::vector<W> gather_strided(const W* src, const Shape& out_shape, const std::vector<int64_t>& strides) {
  int64_t n = numel(out_shape);
  std::vector<W> dst(size_t(std::max<int64_t>(n, 0)));
  if (n == 0) return dst;
  size_t rank = out_shape.size();
  if (rank == 0) {
    dst[0] = src[0];
    return dst;
  }
  int64_t inner = out_shape[rank - 1], inner_stride = strides[rank - 1];
  int64_t rows = n / inner;
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t rem = r, off = 0;
      for (size_t d = rank - 1; d-- > 0;) {
        off += (rem % out_shape[d]) * strides[d];
        rem /= out_shape[d];
      }
      W* o = dst.data() + r * inner;
      const W* s = src + off;
      for (int64_t i = 0; i < inner; ++i) o[i] = s[i * inner_stride];
    }
  });
  return dst;
}

template <typename W>
void permute(LT<W>& t, const std::vector<int>& order) {
  if (order == t.labels) return;
  auto st = strides_of(t.shape);
  Shape shape;
  std::vector<int64_t> strides;
  for (int l : order) {
    size_t d = size_t(std::find(t.labels.begin(), t.labels.end(), l) - t.labels.begin());
    shape.push_back(t.shape[d]);
    strides.push_back(st[d]);
  }
  t.data = gather_strided(t.data.data(), shape, strides);
  t.shape = shape;
  t.labels = order;
}

// Merges repeated labels into their diagonal.
template <typename W>
void take_diagonals(LT<W>& t, const Node& node) {
  auto st = strides_of(t.shape);
  std::vector<int> labels;
  Shape shape;
  std::vector<int64_t> strides;
  for (size_t d = 0; d < t.labels.size(); ++d) {
    auto it = std::find(labels.begin(), labels.end(), t.labels[d]);
    if (it == labels.end()) {
      labels.push_back(t.labels[d]);
      shape.push_back(t.shape[d]);
      strides.push_back(st[d]);
    } else {
      size_t j = size_t(it - labels.begin());
      OT_CHECK(shape[j] == t.shape[d], node.context(), "repeated label '", char(t.labels[d]),
               "' has different sizes ", shape[j], " and ", t.shape[d]);
      strides[j] += st[d];
    }
  }
  if (labels.size() == t.labels.size()) return;
  t.data = gather_strided(t.data.data(), shape, strides);
  t.shape = shape;
  t.labels = labels;
}

// Sums over the given labels (keep_one: keep them as size-1 dims).
template <typename W>
void sum_labels(LT<W>& t, const std::set<int>& drop, bool keep_one = false) {
  std::vector<int> kept, order;
  for (int l : t.labels)
    if (!drop.count(l)) kept.push_back(l);
  if (kept.size() == t.labels.size()) return;
  order = kept;
  for (int l : t.labels)
    if (drop.count(l)) order.push_back(l);
  permute(t, order);
  Shape shape(t.shape.begin(), t.shape.begin() + int64_t(kept.size()));
  int64_t outer = numel(shape), inner = outer ? int64_t(t.data.size()) / std::max<int64_t>(outer, 1) : 0;
  std::vector<W> out(size_t(outer), W(0));
  parallel_for(outer, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      W acc = W(0);
      const W* s = t.data.data() + r * inner;
      for (int64_t i = 0; i < inner; ++i) acc += s[i];
      out[size_t(r)] = acc;
    }
  });
  t.data = std::move(out);
  t.shape = shape;
  t.labels = kept;
  if (keep_one) {
    for (int l : order)
      if (drop.count(l)) {
        t.labels.push_back(l);
        t.shape.push_back(1);
      }
  }
}

template <typename W>
int64_t size_of(const LT<W>& t, int l) {
  auto it = std::find(t.labels.begin(), t.labels.end(), l);
  return it == t.labels.end() ? -1 : t.shape[size_t(it - t.labels.begin())];
}

template <typename W>
LT<W> contract(const Node& node, LT<W>& a, LT<W>& b, const std::set<int>& needed, cpu::MatmulCache& cache) {
  auto in = [](const LT<W>& t, int l) { return std::find(t.labels.begin(), t.labels.end(), l) != t.labels.end(); };
  // Labels only one side has and nothing later needs: sum them first.
  std::set<int> drop_a, drop_b;
  for (int l : a.labels)
    if (!in(b, l) && !needed.count(l)) drop_a.insert(l);
  for (int l : b.labels)
    if (!in(a, l) && !needed.count(l)) drop_b.insert(l);
  sum_labels(a, drop_a);
  sum_labels(b, drop_b);
  std::vector<int> batch, a_only, b_only, con;
  for (int l : a.labels) {
    if (in(b, l)) (needed.count(l) ? batch : con).push_back(l);
    else a_only.push_back(l);
  }
  for (int l : b.labels)
    if (!in(a, l)) b_only.push_back(l);
  // Contracted labels broadcast (size 1 on one side): sum the other side down to 1.
  std::set<int> shrink_a, shrink_b;
  for (int l : con) {
    int64_t sa = size_of(a, l), sb = size_of(b, l);
    OT_CHECK(sa == sb || sa == 1 || sb == 1, node.context(), "label '", char(l), "' has sizes ", sa, " and ", sb);
    if (sa != sb) (sa == 1 ? shrink_b : shrink_a).insert(l);
  }
  if (!shrink_a.empty()) sum_labels(a, shrink_a, true);
  if (!shrink_b.empty()) sum_labels(b, shrink_b, true);
  std::vector<int> oa = batch, ob = batch;
  oa.insert(oa.end(), a_only.begin(), a_only.end());
  oa.insert(oa.end(), con.begin(), con.end());
  ob.insert(ob.end(), con.begin(), con.end());
  ob.insert(ob.end(), b_only.begin(), b_only.end());
  permute(a, oa);
  permute(b, ob);
  cpu::MatmulDims d;
  d.m = d.n = d.k = 1;
  LT<W> r;
  for (int l : batch) {
    int64_t sa = size_of(a, l), sb = size_of(b, l);
    OT_CHECK(sa == sb || sa == 1 || sb == 1, node.context(), "label '", char(l), "' has sizes ", sa, " and ", sb);
    d.a_batch.push_back(sa);
    d.b_batch.push_back(sb);
    r.labels.push_back(l);
    r.shape.push_back(sa == 1 ? sb : sa);
  }
  for (int l : a_only) {
    d.m *= size_of(a, l);
    r.labels.push_back(l);
    r.shape.push_back(size_of(a, l));
  }
  for (int l : con) d.k *= size_of(a, l);
  for (int l : b_only) {
    d.n *= size_of(b, l);
    r.labels.push_back(l);
    r.shape.push_back(size_of(b, l));
  }
  r.data.assign(size_t(numel(r.shape)), W(0));
  if (r.data.empty() || d.k == 0) return r;
  if constexpr (std::is_same_v<W, float>) {
    cache.get(d, node.context()).run(a.data.data(), b.data.data(), r.data.data());
  } else {
    cpu::matmul_reference<W>(d, a.data.data(), b.data.data(), r.data.data());
  }
  return r;
}

void einsum_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  std::vector<Shape> shapes;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const auto& s = ctx.input_shape(i);
    if (!s) {
      ctx.set_output(0, dt);
      return;
    }
    shapes.push_back(*s);
  }
  Equation e = parse_equation(ctx.node(), ctx.node().attr_string("equation", ""), shapes);
  Shape out;
  for (int l : e.output) {
    int64_t size = 1;
    for (size_t i = 0; i < shapes.size(); ++i)
      for (size_t d = 0; d < e.inputs[i].size(); ++d)
        if (e.inputs[i][d] == l) {
          int64_t v = shapes[i][d];
          if (v == -1) size = size == 1 ? -1 : size;
          else if (v != 1) size = v;
        }
    out.push_back(size);
  }
  ctx.set_output(0, dt, out);
}

class EinsumKernel final : public Kernel {
 public:
  explicit EinsumKernel(const Node& node) : equation_(node.attr_string("equation", "")) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    std::vector<Shape> shapes;
    OT_CHECK(ctx.num_inputs() >= 1, node.context(), "needs at least one input");
    DType dt = ctx.input(0).dtype();
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      OT_CHECK(ctx.input(i).dtype() == dt, node.context(), "inputs must share a dtype, got ", dtype_name(dt), " and ",
               dtype_name(ctx.input(i).dtype()));
      shapes.push_back(ctx.input(i).shape());
    }
    Equation e = parse_equation(node, equation_, shapes);
    dispatch_numeric(dt, [&]<typename T>() {
      using C = compute_t<T>;
      using W = std::conditional_t<std::is_same_v<C, float> || std::is_same_v<C, double>, C,
                                   std::conditional_t<std::is_signed_v<C>, int64_t, uint64_t>>;
      std::vector<LT<W>> ops;
      for (size_t i = 0; i < shapes.size(); ++i) {
        LT<W> t;
        const T* p = ctx.input(i).template data<T>();
        t.data.resize(size_t(ctx.input(i).numel()));
        for (size_t j = 0; j < t.data.size(); ++j) t.data[j] = W(C(p[j]));
        t.shape = shapes[i];
        t.labels = e.inputs[i];
        take_diagonals(t, node);
        ops.push_back(std::move(t));
      }
      std::set<int> out_labels(e.output.begin(), e.output.end());
      // Labels needed after operand i: the output's and those of operands i+1...
      auto needed_after = [&](size_t i) {
        std::set<int> s = out_labels;
        for (size_t j = i + 1; j < ops.size(); ++j) s.insert(ops[j].labels.begin(), ops[j].labels.end());
        return s;
      };
      LT<W> cur = std::move(ops[0]);
      {
        std::set<int> need = needed_after(0), drop;
        for (int l : cur.labels)
          if (!need.count(l)) drop.insert(l);
        sum_labels(cur, drop);
      }
      for (size_t i = 1; i < ops.size(); ++i) cur = contract(node, cur, ops[i], needed_after(i), cache_);
      // Output dims absent from the result (broadcast ellipsis of size 1) become size 1.
      for (int l : e.output)
        if (size_of(cur, l) < 0) {
          cur.labels.push_back(l);
          cur.shape.push_back(1);
        }
      permute(cur, e.output);
      Tensor& y = ctx.output(0, dt, cur.shape);
      T* py = y.data<T>();
      for (size_t j = 0; j < cur.data.size(); ++j) py[j] = T(C(cur.data[j]));
    });
  }

 private:
  std::string equation_;
  cpu::MatmulCache cache_;
};

// dX_i = einsum("out, other terms -> X_i's labels", dY, X_j...) for j != i. Ellipsis dims become
// explicit letters; labels of X_i that nothing else has (summed away in the forward) are
// unsqueezed and expanded back. A label X_i repeats (a diagonal, "ii->i") reads only the diagonal:
// the gradient over X_i's distinct labels is placed on it by identity matrices,
// dX[a, b] = G[a] * I[a, b] ("a,aB->aB"), zero elsewhere (the repeated dims' sizes must be static).
// Operands whose size-1 (ellipsis) dims others broadcast get their gradient summed back to 1.
// Not handled (kNotImplemented): a diagonal in an operand that is also broadcast.
void einsum_gradient(GradientBuilder& g) {
  const Node& node = g.node();
  std::vector<Shape> shapes;
  for (size_t i = 0; i < g.num_inputs(); ++i) {
    auto s = g.static_shape(g.x(i));
    if (!s) OT_THROW(kNotImplemented, g.context(), "the gradient needs every operand's rank from shape inference");
    shapes.push_back(*s);
  }
  Equation e = parse_equation(node, node.attr_string("equation", ""), shapes);
  std::set<char> used;
  for (const auto& t : e.inputs)
    for (int l : t)
      if (l < kEllipsisBase) used.insert(char(l));
  std::map<int, char> letter;  // ellipsis label -> a letter the equation does not use
  const std::string pool = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  size_t next = 0;
  auto name = [&](int l) {
    if (l < kEllipsisBase) return char(l);
    auto it = letter.find(l);
    if (it != letter.end()) return it->second;
    while (next < pool.size() && used.count(pool[next])) ++next;
    OT_CHECK(next < pool.size(), g.context(), "too many labels to differentiate the equation");
    used.insert(pool[next]);
    return letter[l] = pool[next];
  };
  auto term = [&](const std::vector<int>& labels) {
    std::string t;
    for (int l : labels) t += name(l);
    return t;
  };
  // Sizes per label: a label of size 1 in one operand and > 1 in another (ellipsis dims) is a
  // broadcast; that operand's gradient comes out at the full size and is summed back to 1.
  std::map<int, int64_t> size;
  for (size_t i = 0; i < e.inputs.size(); ++i)
    for (size_t d = 0; d < e.inputs[i].size(); ++d) {
      const int64_t v = shapes[i][d];
      auto [it, fresh] = size.emplace(e.inputs[i][d], v);
      if (fresh) continue;
      if (v < 0 || it->second < 0) {
        if (v != it->second)
          OT_THROW(kNotImplemented, g.context(), "the gradient needs the static sizes of label dims that may broadcast");
        continue;
      }
      it->second = std::max(it->second, v);
    }
  auto broadcast_in = [&](size_t i) {  // operand i has a size-1 dim the others broadcast
    for (size_t d = 0; d < e.inputs[i].size(); ++d)
      if (shapes[i][d] == 1 && size.at(e.inputs[i][d]) > 1) return true;
    return false;
  };
  std::string out_term = term(e.output);
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    if (!g.needs(i)) continue;
    const auto& li = e.inputs[i];
    std::vector<int> distinct;  // X_i's labels, each once, in order of first appearance
    std::vector<int64_t> distinct_dims;
    for (size_t d = 0; d < li.size(); ++d) {
      if (std::find(distinct.begin(), distinct.end(), li[d]) != distinct.end()) continue;
      distinct.push_back(li[d]);
      distinct_dims.push_back(shapes[i][d]);
    }
    const bool diagonal = distinct.size() != li.size();
    std::set<int> elsewhere(e.output.begin(), e.output.end());
    for (size_t j = 0; j < e.inputs.size(); ++j)
      if (j != i) elsewhere.insert(e.inputs[j].begin(), e.inputs[j].end());
    std::vector<int> kept;
    std::vector<int64_t> missing;  // axes of the distinct labels summed away in the forward
    for (size_t d = 0; d < distinct.size(); ++d) {
      if (elsewhere.count(distinct[d])) kept.push_back(distinct[d]);
      else missing.push_back(int64_t(d));
    }
    std::string eq = out_term;
    std::vector<std::string> ins{g.dy(0)};
    for (size_t j = 0; j < e.inputs.size(); ++j) {
      if (j == i) continue;
      eq += "," + term(e.inputs[j]);
      ins.push_back(g.x(j));
    }
    eq += "->" + term(kept);
    std::string d = g.emit("Einsum", ins, {{"equation", Attribute::of(eq)}});
    if (!diagonal) {
      if (!missing.empty()) d = g.expand_like(g.unsqueeze(d, missing), g.x(i));
      g.set(i, broadcast_in(i) ? g.sum_to(d, g.x(i)) : d);
      continue;
    }
    if (broadcast_in(i))
      OT_THROW(kNotImplemented, g.context(), "no gradient for operand ", i, ": a diagonal with a broadcast dim");
    for (int64_t n : distinct_dims)
      if (n < 0) OT_THROW(kNotImplemented, g.context(), "the gradient of a diagonal needs operand ", i, "'s static shape");
    if (!missing.empty()) d = g.emit("Expand", {g.unsqueeze(d, missing), g.ints(distinct_dims)});
    // Each repeat of a label gets a fresh letter tied to the first by an identity matrix.
    std::string place_eq = term(distinct), place_out;
    std::vector<std::string> place_ins{d};
    std::set<int> placed;
    for (size_t k = 0; k < li.size(); ++k) {
      if (placed.insert(li[k]).second) {
        place_out += name(li[k]);
        continue;
      }
      const int fresh = kEllipsisBase + 1000 + int(k);  // a label no operand has
      const int64_t n = shapes[i][k];
      place_eq += std::string(",") + name(li[k]) + name(fresh);
      place_out += name(fresh);
      place_ins.push_back(g.emit("EyeLike", {g.emit("Expand", {g.scalar_like(0.0, g.x(i)), g.ints({n, n})})}));
    }
    g.set(i, g.emit("Einsum", place_ins, {{"equation", Attribute::of(place_eq + "->" + place_out)}}));
  }
}

}  // namespace

// Y = einsum(eq, X...).  dX_i = einsum of dY with the other operands, with X_i's labels as output
// (labels only X_i has are broadcast back)
ONNXTRAIN_OP(Einsum, kOnnxDomain, 12).inputs(1, INT_MAX).outputs(1).shape(einsum_shape).cpu_kernel<EinsumKernel>()
    .gradient(einsum_gradient);

}  // namespace onnxtrain
