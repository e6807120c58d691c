"""com.microsoft contrib ops (src/ops/contrib/) against ONNX Runtime (the `ort` peer, which
runs them natively) over their attribute combinations, and the MatMulNBits input checks. Gradients
are checked by tests/python/test_gradients.py (samples in grad_samples/contrib.py)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain
import peers

from .contrib_ref import quantize_nbits

MS = "com.microsoft"
rng = np.random.default_rng(2014)
F32 = np.float32
TYPES = {np.dtype(F32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}


def r(*shape):
    return rng.standard_normal(shape).astype(F32)


def model(op, feeds, consts, n_out, domain=MS, **attrs):
    """One-node model: feeds are graph inputs, consts initializers; None leaves an optional slot empty.
    Both are lists of (name, array) in the op's input order (merged by position)."""
    names, inputs, inits = [], [], []
    for slot in feeds:
        name, arr, const = slot
        if arr is None:
            names.append("")
            continue
        names.append(name)
        if const:
            inits.append(numpy_helper.from_array(arr, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, TYPES[arr.dtype], list(arr.shape)))
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                    for o in outs], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def compare(tmp_path, op, slots, n_out=1, rtol=1e-4, atol=1e-5, domain=MS, **attrs):
    m = model(op, slots, None, n_out, domain=domain, **attrs)
    path = str(tmp_path / f"{op}.onnx")
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    feeds = {name: arr for name, arr, const in slots if arr is not None and not const}
    ours = onnxtrain.InferenceSession(m.SerializeToString()).run(None, feeds)
    theirs = peers.ort_run(path, feeds, str(tmp_path))
    assert len(ours) == len(theirs)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{op} {attrs} output {k}")


def inp(name, arr):
    return (name, arr, False)


def const(name, arr):
    return (name, arr, True)


NBITS_CASES = [(4, 32, None, False, (1, 1)), (4, 32, "packed", True, (1, 64)), (4, 16, "float", False, (2, 5)),
               (8, 64, "packed", False, (1, 3)), (8, 128, None, True, (2, 40)), (4, 256, "packed", False, (1, 8)),
               (2, 16, "packed", False, (1, 6)), (4, 64, "float", True, (1, 3)), (4, 128, "packed", True, (2, 2))]


@pytest.mark.parametrize("bits,block,zp,bias,m", NBITS_CASES)
def test_matmul_nbits_matches_onnx_runtime(tmp_path, ort_peer, bits, block, zp, bias, m):
    k, n = 300, 72          # K not a multiple of the block size: a partial last block
    b, s, z, deq = quantize_nbits(rng.standard_normal((n, k)), bits=bits, block=block, zp=zp)
    slots = [inp("A", r(*m, k)), const("B", b), const("scales", s.astype(F32)),
             const("zp", None if z is None else (z if z.dtype == np.uint8 else z.astype(F32))),
             ("g", None, True), const("bias", r(n) if bias else None)]
    while slots[-1][1] is None:
        slots.pop()
    compare(tmp_path, "MatMulNBits", slots, K=k, N=n, bits=bits, block_size=block, rtol=2e-4, atol=2e-4)


def test_matmul_nbits_matches_dequantized_numpy():
    for bits in (2, 4, 8):
        for m in ((1, 2), (3, 17)):
            k, n = 96, 41        # N odd: the decode kernel's single-row tail
            b, s, z, deq = quantize_nbits(rng.standard_normal((n, k)), bits=bits, block=32, zp="packed")
            a = r(*m, k)
            sess = onnxtrain.InferenceSession(model("MatMulNBits", [inp("A", a), const("B", b), const("s", s.astype(F32)),
                                                                    const("z", z)], None, 1, K=k, N=n, bits=bits,
                                                    block_size=32).SerializeToString())
            np.testing.assert_allclose(sess.run(None, {"A": a})[0], a.astype(np.float64) @ deq.T, rtol=1e-4, atol=1e-4)


def test_matmul_nbits_rejects_inconsistent_blobs():
    k, n = 64, 8
    b, s, z, _ = quantize_nbits(rng.standard_normal((n, k)), bits=4, block=32, zp="packed")
    a = r(1, k)
    bad = [("B", dict(B=b[:, :1]), "expected B of shape \\[N, k_blocks, blob_size\\] = \\[8, 2, 16\\]"),
           ("scales", dict(s=s[:-1].astype(F32)), "expected 16 scales"),
           ("zero points", dict(z=z[:-1]), "packed uint8 zero_points of 8 bytes"),
           ("block size", dict(block_size=24), "power of 2")]
    for what, change, msg in bad:
        vals = dict(B=b, s=s.astype(F32), z=z, block_size=32)
        vals.update(change)
        m = model("MatMulNBits", [inp("A", a), const("B", vals["B"]), const("s", vals["s"]), const("z", vals["z"])], None,
                  1, K=k, N=n, bits=4, block_size=vals["block_size"])
        with pytest.raises(onnxtrain.Error, match=msg):
            onnxtrain.InferenceSession(m.SerializeToString()).run(None, {"A": a})


@pytest.mark.parametrize("with_bias,with_sum,rms", [(False, False, True), (True, True, True), (False, True, False),
                                                    (True, True, False)])
def test_skip_norms_match_onnx_runtime(tmp_path, ort_peer, with_bias, with_sum, rms):
    h = 32
    slots = [inp("x", r(2, 5, h)), inp("skip", r(2, 5, h)), const("gamma", r(h))]
    if not rms:
        slots.append(const("beta", r(h)))
    if with_bias:
        slots.append(const("bias", r(h)))
    op = "SkipSimplifiedLayerNormalization" if rms else "SkipLayerNormalization"
    n_out = 4 if with_sum else 1
    # mean/inv_std_var are requested only where ONNX Runtime fills them the same way (the sum output).
    m_slots = slots
    compare_outputs = [0, 3] if with_sum else [0]
    m = model(op, m_slots, None, n_out, epsilon=1e-5)
    if with_sum:  # leave mean and inv_std_var unrequested
        m.graph.node[0].output[1] = ""
        m.graph.node[0].output[2] = ""
        del m.graph.output[1:3]
    path = str(tmp_path / "m.onnx")
    open(path, "wb").write(m.SerializeToString())
    feeds = {"x": slots[0][1], "skip": slots[1][1]}
    ours = onnxtrain.InferenceSession(m.SerializeToString()).run(None, feeds)
    theirs = peers.ort_run(path, feeds, str(tmp_path))
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert len(ours) == len(compare_outputs)


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm_matches_onnx_runtime(tmp_path, ort_peer, axis):
    x = r(2, 3, 8)
    scale = r(8) if axis == -1 else r(3, 8)
    compare(tmp_path, "SimplifiedLayerNormalization", [inp("x", x), const("scale", scale)], domain="",
            axis=axis, epsilon=1e-5)


@pytest.mark.parametrize("layout,interleaved,rot,pos_kind", [("bsh", 0, 0, "ids"), ("bsh", 1, 0, "offset"),
                                                              ("bnsh", 0, 0, "ids"), ("bsh", 0, 8, "ids")])
def test_rotary_embedding_matches_onnx_runtime(tmp_path, ort_peer, layout, interleaved, rot, pos_kind):
    b, s, heads, hs = 2, 5, 2, 16
    half = (rot or hs) // 2
    ang = np.arange(32)[:, None] * (1.0 / 10000 ** (np.arange(half) / half))[None, :]
    x = r(b, s, heads * hs) if layout == "bsh" else r(b, heads, s, hs)
    pos = rng.integers(0, 27, (b, s)).astype(np.int64) if pos_kind == "ids" else np.array([3], np.int64)
    attrs = dict(interleaved=interleaved)
    if rot:
        attrs.update(rotary_embedding_dim=rot, num_heads=heads)
    compare(tmp_path, "RotaryEmbedding", [inp("x", x), inp("pos", pos), const("cos", np.cos(ang).astype(F32)),
                                                      const("sin", np.sin(ang).astype(F32))], **attrs)


def test_gelus_match_onnx_runtime(tmp_path, ort_peer):
    x, bias = r(3, 7, 16) * 2, r(16)
    compare(tmp_path, "FastGelu", [inp("x", x)])
    compare(tmp_path, "FastGelu", [inp("x", x), const("bias", bias)])
    compare(tmp_path, "BiasGelu", [inp("x", x), const("bias", bias)])
    compare(tmp_path, "QuickGelu", [inp("x", x)], alpha=1.5)
    compare(tmp_path, "FusedMatMul", [inp("a", r(2, 6, 5)), inp("b", r(2, 4, 6))], transA=1, transB=1,
            alpha=0.7)


@pytest.mark.parametrize("causal,past,bias,attn_bias", [(0, 0, 0, 0), (1, 0, 1, 0), (1, 3, 0, 1), (0, 2, 1, 0)])
def test_multi_head_attention_matches_onnx_runtime(tmp_path, ort_peer, causal, past, bias, attn_bias):
    b, s, h, d = 2, 4, 2, 8
    slots = [inp("q", r(b, s, h * d)), inp("k", r(b, s, h * d)), inp("v", r(b, s, h * d)),
             const("bias", r(3 * h * d) if bias else None), ("mask", None, True),
             inp("ab", r(1, h, s, s + past) if attn_bias else None),
             inp("pk", r(b, h, past, d) if past else None), inp("pv", r(b, h, past, d) if past else None)]
    while slots[-1][1] is None:
        slots.pop()
    compare(tmp_path, "MultiHeadAttention", slots, n_out=3 if past else 1, num_heads=h,
            unidirectional=causal)


@pytest.mark.parametrize("past,s,hq,hkv", [(0, 6, 4, 2), (0, 5, 4, 4), (5, 1, 4, 1), (3, 2, 2, 1)])
def test_group_query_attention_matches_onnx_runtime(tmp_path, ort_peer, past, s, hq, hkv):
    b, d = 1 if s > 1 and past else 2, 16
    total = past + s
    slots = [inp("q", r(b, s, hq * d)), inp("k", r(b, s, hkv * d)), inp("v", r(b, s, hkv * d)),
             inp("pk", r(b, hkv, past, d) if past else None), inp("pv", r(b, hkv, past, d) if past else None),
             inp("seqlens", np.full(b, total - 1, np.int32)), inp("total", np.array(total, np.int32))]
    compare(tmp_path, "GroupQueryAttention", slots, n_out=3, num_heads=hq, kv_num_heads=hkv)
