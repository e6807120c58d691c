"""Samples for the com.microsoft contrib ops in src/ops/contrib/ and their onnxtrain grads."""
import numpy as np

from ..contrib_ref import quantize_nbits
from ..gradcheck import Sample

rng = np.random.default_rng(14)
MS = "com.microsoft"


def r(*shape):
    return rng.standard_normal(shape)


def nbits(bits, block, k, n, zp, m=(2, 3), bias=False):
    b, s, z, _ = quantize_nbits(r(n, k), bits=bits, block=block, zp=zp)
    ins = [r(*m, k), b, s, z, None, r(n) if bias else None]
    while ins[-1] is None:
        ins.pop()
    return Sample(ins, attrs=dict(K=k, N=n, bits=bits, block_size=block), domain=MS, constants=[1, 2, 3],
                  name=f"bits={bits} block={block} zp={zp} bias={bias}")


def cache(max_pos, half):
    ang = np.arange(max_pos)[:, None] * (1.0 / 10000 ** (np.arange(half) / half))[None, :]
    return np.cos(ang), np.sin(ang)


cos, sin = cache(16, 4)
pos = np.array([[0, 1, 2], [5, 3, 7]], np.int64)

SAMPLES = {
    # ONNX Runtime's training-graph ops (src/ops/contrib/scale.cc, fused/gelu.cc, tensor/concat_split.cc).
    "com.microsoft.Scale": [Sample([r(3, 4), np.array([2.5])], domain=MS, wrt=[0], constants=[1]),
                            Sample([r(3, 4), np.array(4.0)], attrs=dict(scale_down=1), domain=MS, wrt=[0],
                                   constants=[1], name="scale_down")],
    "com.microsoft.Gelu": [Sample([r(3, 5)], domain=MS)],
    "com.microsoft.ConcatTraining": [Sample([r(2, 3), r(2, 1)], attrs=dict(axis=1), domain=MS),
                                     Sample([r(1, 3), r(2, 3)], attrs=dict(axis=0), domain=MS, n_outputs=2,
                                            name="lengths")],
    "com.microsoft.MatMulNBits": [
        nbits(4, 16, 40, 5, "packed", bias=True),     # K not a multiple of the block: a partial last block
        nbits(4, 32, 32, 3, None, m=(1,)),             # decode path (M <= 4), default zero point
        nbits(8, 16, 32, 4, "float", m=(6,)),          # panel path, float zero points
        nbits(2, 16, 16, 3, "packed", m=(5,)),
    ],
    "SimplifiedLayerNormalization": [
        Sample([r(2, 3, 4) + 0.5, r(4)], attrs=dict(epsilon=1e-5), name="last axis"),
        Sample([r(2, 3, 4), r(3, 4)], attrs=dict(axis=1), name="axis=1"),
    ],
    "com.microsoft.SimplifiedLayerNormalization": [Sample([r(3, 5), r(5)], domain=MS)],
    "com.microsoft.SkipSimplifiedLayerNormalization": [
        Sample([r(2, 3, 4), r(2, 3, 4), r(4)], attrs=dict(epsilon=1e-5), domain=MS),
        Sample([r(2, 3, 4), r(3, 4), r(4), r(4)], attrs=dict(epsilon=1e-5), domain=MS, n_outputs=4, outputs=(0, 3),
               name="broadcast skip, bias, sum output"),
    ],
    "com.microsoft.SkipLayerNormalization": [
        Sample([r(2, 3, 4), r(2, 3, 4), r(4), r(4)], attrs=dict(epsilon=1e-5), domain=MS),
        Sample([r(2, 3, 4), r(1, 3, 4), r(4), r(4), r(4)], attrs=dict(epsilon=1e-5), domain=MS, n_outputs=4,
               outputs=(0, 3), name="broadcast skip, beta, bias, sum output"),
    ],
    "com.microsoft.RotaryEmbedding": [
        Sample([r(2, 3, 16), pos, cos, sin], attrs=dict(num_heads=2), domain=MS, constants=[2, 3],
               name="3-D, half-split"),
        Sample([r(2, 2, 3, 8), np.array([2], np.int64), cos, sin], attrs=dict(interleaved=1), domain=MS,
               constants=[2, 3], name="4-D, interleaved, offset"),
        Sample([r(1, 3, 20), pos[:1], cos, sin], attrs=dict(num_heads=2, rotary_embedding_dim=8), domain=MS,
               constants=[2, 3], name="partial rotary"),
    ],
    "com.microsoft.FastGelu": [Sample([r(3, 4)], domain=MS), Sample([r(2, 3, 4), r(4)], domain=MS, name="bias")],
    "com.microsoft.BiasGelu": [Sample([r(2, 3, 4), r(4)], domain=MS)],
    "com.microsoft.QuickGelu": [Sample([r(3, 4)], domain=MS), Sample([r(5)], attrs=dict(alpha=1.3), domain=MS)],
    "com.microsoft.FusedMatMul": [Sample([r(2, 4, 3), r(5, 4)], attrs=dict(transA=1, transB=1, alpha=0.5), domain=MS)],
    "com.microsoft.MultiHeadAttention": [
        Sample([r(2, 3, 8), r(2, 3, 8), r(2, 3, 8)], attrs=dict(num_heads=2), domain=MS, name="self"),
        Sample([r(1, 3, 8), r(1, 4, 8), r(1, 4, 6), r(22)], attrs=dict(num_heads=2, unidirectional=1, scale=0.3),
               domain=MS, name="causal, cross length, bias, Dv != D"),
        Sample([r(2, 2, 8), r(2, 2, 8), r(2, 2, 8), None, None, r(1, 2, 2, 5), r(2, 2, 3, 4), r(2, 2, 3, 4)],
               attrs=dict(num_heads=2, unidirectional=1), domain=MS, constants=[5], n_outputs=3,
               name="past key/value, attention_bias"),
    ],
    "com.microsoft.GroupQueryAttention": [
        Sample([r(2, 4, 8), r(2, 4, 4), r(2, 4, 4), None, None, np.array([3, 3], np.int32), np.array(4, np.int32)],
               attrs=dict(num_heads=4, kv_num_heads=2), domain=MS, name="causal prompt, 2 q heads per kv head"),
        Sample([r(1, 2, 8), r(1, 2, 4), r(1, 2, 4), r(1, 1, 3, 4), r(1, 1, 3, 4), np.array([4], np.int32),
                np.array(5, np.int32)], attrs=dict(num_heads=2, kv_num_heads=1), domain=MS, n_outputs=3,
               name="with past"),
    ],
}
