"""A numpy reference of the MatMulNBits weight layout (ONNX Runtime's ContribOperators.md), written
independently of the C++ quantizer so tests can build blobs and check both against each other."""
import numpy as np


def pack_bits(values, bits):
    """Packs integers < 2**bits along the last axis, least significant bits first."""
    values = np.asarray(values, dtype=np.uint16)
    per = 8 // bits
    n = values.shape[-1]
    padded = np.zeros(values.shape[:-1] + ((n + per - 1) // per * per,), np.uint16)
    padded[..., :n] = values
    padded = padded.reshape(values.shape[:-1] + (-1, per))
    out = np.zeros(padded.shape[:-1], np.uint16)
    for j in range(per):
        out |= padded[..., j] << (j * bits)
    return out.astype(np.uint8)


def quantize_nbits(w, bits=4, block=32, symmetric=False, zp="packed", rng=None):
    """w [N, K] float -> (B [N, kb, blob] uint8, scales [N * kb], zero_points or None, dequantized w).
    zp: "packed" (uint8), "float" (A's dtype) or None (the default 2**(bits-1), symmetric)."""
    w = np.asarray(w, np.float64)
    n, k = w.shape
    kb = (k + block - 1) // block
    wp = np.zeros((n, kb * block))
    wp[:, :k] = w
    blocks = wp.reshape(n, kb, block)
    qmax = 2 ** bits - 1
    if zp is None or symmetric:
        amax = np.abs(blocks).max(axis=2)
        half = 2 ** (bits - 1)
        scale = np.where(amax > 0, amax / half, 1.0)
        zero = np.full((n, kb), float(half))
    else:
        lo = np.minimum(blocks.min(axis=2), 0)
        hi = np.maximum(blocks.max(axis=2), 0)
        scale = np.where(hi > lo, (hi - lo) / qmax, 1.0)
        zero = np.clip(np.round(-lo / scale), 0, qmax)
    q = np.clip(np.round(blocks / scale[..., None] + zero[..., None]), 0, qmax).astype(np.uint8)
    deq = ((q.astype(np.float64) - zero[..., None]) * scale[..., None]).reshape(n, kb * block)[:, :k]
    b = pack_bits(q, bits).reshape(n, kb, block * bits // 8)
    if zp == "packed" and not symmetric:
        zpt = pack_bits(zero.astype(np.uint8), bits).reshape(-1)
    elif zp == "float" and not symmetric:
        zpt = zero.reshape(-1)
    else:
        zpt = None
    return b, scale.reshape(-1), zpt, deq
