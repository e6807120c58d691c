// TfIdfVectorizer: counts the n-grams of a pool in each row of integer tokens, with skips, and
// writes their term frequencies, IDF weights or both into a vector per row.
//
// The pool holds the n-grams flattened by length: ngram_counts[k] is where the (k+1)-grams begin,
// and n-gram i (unigrams first, then bigrams, ...) lands in output column ngram_indexes[i]. An
// n-gram with skip s takes every (s+1)-th token from its start: for [94, 17, 36, 12, 28] and
// s = 2 the bigrams are [94, 12] and [17, 28]. Every skip from 0 to max_skip_count counts,
// except for unigrams, which have no gaps and count once.
#include <algorithm>
#include <map>
#include <vector>

#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

// The pool as maps from an n-gram's tokens to its output column, one map per length.
struct NgramPool {
  std::vector<std::map<std::vector<int64_t>, int64_t>> by_length;  // [n - 1]: the n-grams' columns
  std::vector<float> weights;                                        // per column; empty: all 1
  int64_t columns = 0;
};

int64_t output_columns(const Node& node) {
  int64_t columns = 0;
  for (int64_t i : node.attr_ints("ngram_indexes")) columns = std::max(columns, i + 1);
  return columns;
}

NgramPool read_pool(const Node& node) {
  OT_CHECK(!node.has_attr("pool_strings"), node.context(),
           "pool_strings: string tensors are not supported; give integer tokens with pool_int64s");
  const std::vector<int64_t> pool = node.attr_ints("pool_int64s");
  const std::vector<int64_t> counts = node.attr_ints("ngram_counts");
  const std::vector<int64_t> indexes = node.attr_ints("ngram_indexes");
  const std::vector<float> weights = node.attr_floats("weights");
  const int64_t max_n = node.attr_int("max_gram_length", 0);
  OT_CHECK(max_n >= 1 && int64_t(counts.size()) <= max_n, node.context(), "max_gram_length should be at least 1 and ",
           "at least the number of ngram_counts (", counts.size(), "), got ", max_n);
  NgramPool p;
  p.by_length.resize(size_t(max_n));
  p.columns = output_columns(node);
  int64_t id = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    const int64_t n = int64_t(k) + 1, begin = counts[k];
    const int64_t end = k + 1 < counts.size() ? counts[k + 1] : int64_t(pool.size());
    OT_CHECK(begin >= 0 && begin <= end && end <= int64_t(pool.size()) && (end - begin) % n == 0, node.context(),
             "ngram_counts[", k, "] = ", begin, ": the ", n, "-grams should fill pool_int64s[", begin, ", ", end,
             ") with a multiple of ", n, " tokens (pool of ", pool.size(), ")");
    for (int64_t at = begin; at < end; at += n, ++id) {
      OT_CHECK(id < int64_t(indexes.size()), node.context(), "ngram_indexes has ", indexes.size(),
               " entries, fewer than the pool's n-grams");
      OT_CHECK(indexes[size_t(id)] >= 0, node.context(), "ngram_indexes[", id, "] = ", indexes[size_t(id)],
               " is negative");
      p.by_length[k].emplace(std::vector<int64_t>(pool.begin() + at, pool.begin() + at + n), indexes[size_t(id)]);
    }
  }
  OT_CHECK(weights.empty() || weights.size() == indexes.size(), node.context(), "weights has ", weights.size(),
           " entries, ngram_indexes ", indexes.size());
  if (!weights.empty()) {
    p.weights.assign(size_t(p.columns), 0.0f);
    for (size_t i = 0; i < size_t(id); ++i) p.weights[size_t(indexes[i])] = weights[i];
  }
  return p;
}

void tfidf_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.dtype() == DType::kInt32 || x.dtype() == DType::kInt64, node.context(),
           "tokens should be int32 or int64, got ", dtype_name(x.dtype()));
  OT_CHECK(x.rank() == 1 || x.rank() == 2, node.context(), "tokens should be [C] or [N, C], got ", shape_str(x.shape()));
  const NgramPool pool = read_pool(node);
  const std::string mode = node.attr_string("mode", "");
  OT_CHECK(mode == "TF" || mode == "IDF" || mode == "TFIDF", node.context(), "mode should be TF, IDF or TFIDF, got '",
           mode, "'");
  const int64_t min_n = node.attr_int("min_gram_length", 0), max_n = node.attr_int("max_gram_length", 0);
  const int64_t max_skip = node.attr_int("max_skip_count", 0);
  OT_CHECK(min_n >= 1 && min_n <= max_n && max_skip >= 0, node.context(), "need 1 <= min_gram_length (", min_n,
           ") <= max_gram_length (", max_n, ") and max_skip_count >= 0 (", max_skip, ")");
  const int64_t rows = x.rank() == 2 ? x.dim(0) : 1, length = x.dim(x.rank() - 1);
  Tensor& y = ctx.output(0, DType::kFloat32, x.rank() == 2 ? Shape{rows, pool.columns} : Shape{pool.columns});
  float* out = y.data<float>();
  std::fill(out, out + y.numel(), 0.0f);

  auto count_rows = [&]<typename T>(const T* tokens) {
    parallel_for(rows, 1, [&](int64_t b, int64_t e) {
      std::vector<int64_t> gram;
      for (int64_t r = b; r < e; ++r) {
        const T* row = tokens + r * length;
        float* counts = out + r * pool.columns;
        for (int64_t skip = 0; skip <= max_skip; ++skip) {
          const int64_t step = skip + 1;
          for (int64_t n = std::max<int64_t>(min_n, skip > 0 ? 2 : 1); n <= max_n; ++n) {
            const auto& grams = pool.by_length[size_t(n - 1)];
            if (grams.empty()) continue;
            for (int64_t start = 0; start + (n - 1) * step < length; ++start) {
              gram.resize(size_t(n));
              for (int64_t k = 0; k < n; ++k) gram[size_t(k)] = int64_t(row[start + k * step]);
              auto it = grams.find(gram);
              if (it != grams.end()) counts[it->second] += 1.0f;
            }
          }
        }
        // counts -> TF as they are; IDF: the weight where the n-gram occurs; TFIDF: count x weight.
        if (mode == "TF") continue;
        for (int64_t c = 0; c < pool.columns; ++c) {
          const float w = pool.weights.empty() ? 1.0f : pool.weights[size_t(c)];
          counts[c] = mode == "IDF" ? (counts[c] > 0.0f ? w : 0.0f) : counts[c] * w;
        }
      }
    });
  };
  if (x.dtype() == DType::kInt32) {
    count_rows(x.data<int32_t>());
  } else {
    count_rows(x.data<int64_t>());
  }
}

void tfidf_rule(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(0);
  const int64_t columns = output_columns(ctx.node());
  if (!in) return ctx.set_output(0, DType::kFloat32);
  OT_CHECK(in->size() == 1 || in->size() == 2, ctx.node().context(), "tokens should be [C] or [N, C], got rank ",
           in->size());
  ctx.set_output(0, DType::kFloat32, in->size() == 2 ? Shape{(*in)[0], columns} : Shape{columns});
}

}  // namespace

// y[r, ngram_indexes[i]] = TF, IDF or TF-IDF of pool n-gram i in row r. Integer tokens in,
// counts out: nothing to differentiate.
ONNXTRAIN_OP(TfIdfVectorizer, kOnnxDomain, 9).inputs(1).outputs(1).shape(tfidf_rule).cpu(tfidf_kernel)
    .not_differentiable();

}  // namespace onnxtrain
