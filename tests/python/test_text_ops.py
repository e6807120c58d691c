"""TfIdfVectorizer beyond the ONNX node cases (which cover TF mode only): TF against a brute-force
count of skip-grams, IDF and TF-IDF with and without weights, 1-D input, and bad attributes as
errors that name the node."""
import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxtrain


def tfidf_model(attrs, tokens):
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], name="tfidf", **attrs)
    elem = TensorProto.INT32 if tokens.dtype == np.int32 else TensorProto.INT64
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, tokens.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def run(attrs, tokens):
    return onnxtrain.InferenceSession(tfidf_model(attrs, tokens)).run(None, {"x": tokens})[0]


def skip_gram_counts(row, n, max_skip):
    """Every n-gram of `row` taking each (s+1)-th token, for each s in 0..max_skip (0 only for n = 1)."""
    counts = {}
    for skip in range(max_skip + 1 if n > 1 else 1):
        for start in range(len(row)):
            picks = [start + k * (skip + 1) for k in range(n)]
            if picks[-1] < len(row):
                gram = tuple(int(row[p]) for p in picks)
                counts[gram] = counts.get(gram, 0) + 1
    return counts


def pool_attrs(grams_by_length, columns, mode, min_n, max_n, max_skip, weights=None):
    pool, counts, n_grams = [], [], 0
    for grams in grams_by_length:
        counts.append(len(pool))
        for g in grams:
            pool.extend(g)
            n_grams += 1
    attrs = dict(mode=mode, min_gram_length=min_n, max_gram_length=max_n, max_skip_count=max_skip,
                 ngram_counts=counts, ngram_indexes=columns[:n_grams], pool_int64s=pool)
    if weights is not None:
        attrs["weights"] = weights[:n_grams]
    return attrs


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("min_n,max_n,max_skip", [(1, 1, 0), (1, 3, 2), (2, 3, 0), (2, 2, 4), (3, 3, 1)])
def test_counts_every_skip_gram_of_the_pool(dtype, min_n, max_n, max_skip):
    rng = np.random.default_rng(min_n * 100 + max_n * 10 + max_skip)
    tokens = rng.integers(0, 4, (3, 17)).astype(dtype)  # a small vocabulary: n-grams repeat
    all_grams = [sorted(set(itertools.product(range(4), repeat=n)))[:: 2 + n] for n in (1, 2, 3)]
    n_grams = sum(len(g) for g in all_grams)
    columns = [int(c) for c in rng.permutation(n_grams + 3)[:n_grams]]  # unused columns stay 0
    weights = [float(w) for w in rng.uniform(0.5, 2.0, n_grams)]
    out_dim = max(columns[:sum(len(g) for g in all_grams[:max_n])]) + 1  # max(ngram_indexes) + 1
    tf = np.zeros((3, out_dim), np.float32)
    for r, row in enumerate(tokens):
        i = 0
        for n, grams in zip((1, 2, 3), all_grams):
            counts = skip_gram_counts(row, n, max_skip)
            for g in grams:
                if min_n <= n <= max_n:
                    tf[r, columns[i]] = counts.get(g, 0)
                i += 1
    w = np.zeros(out_dim, np.float32)
    for c, weight in zip(columns, weights):
        if c < out_dim:
            w[c] = weight

    def attrs(mode, weights=None):
        return pool_attrs(all_grams[:max_n], columns, mode, min_n, max_n, max_skip, weights)

    np.testing.assert_array_equal(run(attrs("TF"), tokens), tf)
    assert tf.sum() > 0  # the pool does occur in the rows
    np.testing.assert_array_equal(run(attrs("IDF"), tokens), (tf > 0).astype(np.float32))
    np.testing.assert_allclose(run(attrs("IDF", weights), tokens), (tf > 0) * w, rtol=1e-6)
    np.testing.assert_allclose(run(attrs("TFIDF", weights), tokens), tf * w, rtol=1e-6)
    np.testing.assert_array_equal(run(attrs("TFIDF"), tokens), tf)
    # A 1-D input is one row.
    np.testing.assert_array_equal(run(attrs("TF"), tokens[1]), tf[1])


@pytest.mark.parametrize("change,message", [
    (dict(mode="BM25"), "mode should be TF, IDF or TFIDF, got 'BM25'"),
    (dict(ngram_counts=[0, 3]), "should fill pool_int64s[3, 4) with a multiple of 2 tokens"),
    (dict(ngram_indexes=[0]), "ngram_indexes has 1 entries, fewer than the pool's n-grams"),
    (dict(min_gram_length=3), "need 1 <= min_gram_length (3) <= max_gram_length (2)"),
    (dict(weights=[1.0]), "weights has 1 entries, ngram_indexes 3"),
    (dict(pool_strings=["a", "b", "c", "d"]), "string tensors are not supported"),
])
def test_bad_attributes_are_errors_naming_the_node(change, message):
    attrs = dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=0, ngram_counts=[0, 2],
                 ngram_indexes=[0, 1, 2], pool_int64s=[1, 2, 1, 2])
    attrs.update(change)
    with pytest.raises(onnxtrain.Error) as err:
        run(attrs, np.array([[1, 2, 1]], np.int64))
    assert "[TfIdfVectorizer] node 'tfidf'" in str(err.value) and message in str(err.value), str(err.value)
