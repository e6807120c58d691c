"""Samples for src/ops/linalg/, src/ops/conv/ and src/ops/resize/ (float64, <= ~100 elements per
differentiated input: finite differences cost two forward runs per element)."""
import numpy as np

from ..gradcheck import Sample

rng = np.random.default_rng(23)


def r(*shape):
    return rng.standard_normal(shape)


def distinct(*shape):
    """Values with well-separated entries (max pooling: no ties within eps)."""
    n = int(np.prod(shape))
    return (rng.permutation(n).astype(np.float64) * 0.37 - n * 0.15).reshape(shape)


OT = "onnxtrain"

SAMPLES = {
    "MatMul": [
        Sample([r(3, 4), r(4, 5)], name="2d"),
        Sample([r(2, 3, 4), r(4, 2)], name="batched A, 2-D weight"),
        Sample([r(2, 1, 3, 4), r(3, 4, 2)], name="broadcast batch"),
        Sample([r(3, 4), r(2, 4, 3)], name="2-D A, batched B"),
        Sample([r(4), r(4, 3)], name="1-D A"),
        Sample([r(2, 3, 4), r(4)], name="1-D B"),
        Sample([r(5), r(5)], name="dot"),
        Sample([r(4), r(2, 4, 3)], name="1-D A, batched B"),
    ],
    "Gemm": [
        Sample([r(3, 4), r(4, 5), r(5)], name="bias row"),
        Sample([r(4, 3), r(4, 5), r(3, 5)], attrs=dict(transA=1, alpha=0.5, beta=2.0), name="transA, full C"),
        Sample([r(3, 4), r(5, 4), r(3, 1)], attrs=dict(transB=1, beta=-1.5), name="transB, column C"),
        Sample([r(4, 3), r(5, 4), np.array(0.7)], attrs=dict(transA=1, transB=1, alpha=2.0), name="both, scalar C"),
        Sample([r(3, 4), r(4, 2)], name="no C"),
    ],
    "onnxtrain.FusedMatMul": [
        Sample([r(3, 4), r(4, 5)], domain=OT, name="plain"),
        Sample([r(2, 4, 3), r(4, 5)], attrs=dict(transA=1), domain=OT, name="transA batched"),
        Sample([r(2, 3, 4), r(5, 4), r(5)], attrs=dict(transB=1, alpha=0.5), domain=OT, name="transB bias alpha"),
        Sample([r(2, 1, 4, 3), r(3, 5, 4)], attrs=dict(transA=1, transB=1), domain=OT, name="both, broadcast"),
        Sample([r(2, 3, 4), r(4, 5), r(5)], domain=OT, name="bias"),
        Sample([r(4), r(4, 3)], attrs=dict(alpha=-2.0), domain=OT, name="1-D A"),
    ],
}

SAMPLES.update({
    "Einsum": [
        Sample([r(3, 4), r(4, 5)], attrs=dict(equation="ij,jk->ik"), name="matmul"),
        Sample([r(2, 3, 4), r(2, 4, 3)], attrs=dict(equation="bij,bjk->bik"), name="batched"),
        Sample([r(2, 3, 4), r(2, 4, 2)], attrs=dict(equation="...ij,...jk->...ik"), name="ellipsis"),
        Sample([r(3, 4)], attrs=dict(equation="ij->"), name="sum all"),
        Sample([r(3, 4)], attrs=dict(equation="ij->ji"), name="transpose"),
        Sample([r(3, 4), r(4)], attrs=dict(equation="ij,j->i"), name="matvec"),
        Sample([r(3), r(4)], attrs=dict(equation="i,j->ij"), name="outer"),
        Sample([r(2, 3, 4), r(3, 4)], attrs=dict(equation="ijk,jk"), name="implicit output"),
        Sample([r(3, 4), r(5)], attrs=dict(equation="ij,k->ik"), name="label summed away"),
        Sample([r(2, 3), r(3, 4), r(4, 2)], attrs=dict(equation="ij,jk,kl->il"), name="three operands"),
        Sample([r(3, 3)], attrs=dict(equation="ii->i"), name="diagonal"),
        Sample([r(4, 4)], attrs=dict(equation="ii->"), name="trace"),
        Sample([r(2, 3, 3)], attrs=dict(equation="bii->bi"), name="batched diagonal"),
        Sample([r(3, 3, 2), r(2, 4)], attrs=dict(equation="iij,jk->ik"), name="diagonal times matrix"),
        Sample([r(2, 3), r(3, 3)], attrs=dict(equation="ij,jj->i"), name="diagonal of the second operand"),
        Sample([r(2, 2, 2)], attrs=dict(equation="iii->i"), name="a label three times"),
        Sample([r(1, 3, 2), r(4, 2, 2)], attrs=dict(equation="...ij,...jk->...ik"), name="ellipsis broadcast"),
        Sample([r(2, 1, 3), r(1, 4, 3)], attrs=dict(equation="...j,...j->..."), name="ellipsis broadcast both ways"),
    ],
    "Conv": [
        Sample([r(1, 2, 7), r(3, 2, 3), r(3)], attrs=dict(pads=[1, 1]), name="1-d bias"),
        Sample([r(1, 2, 5, 5), r(2, 2, 2, 2)], attrs=dict(strides=[2, 1], dilations=[1, 2]), name="strides dilation"),
        Sample([r(1, 4, 4, 4), r(4, 2, 3, 3), r(4)], attrs=dict(group=2, pads=[1, 0, 1, 1]), name="groups"),
        Sample([r(2, 1, 5, 5), r(2, 1, 3, 3)], attrs=dict(auto_pad="SAME_UPPER", strides=[2, 2]), name="same upper"),
        Sample([r(1, 2, 6), r(2, 2, 4)], attrs=dict(auto_pad="SAME_LOWER", strides=[2]), name="same lower"),
        Sample([r(1, 1, 3, 4, 4), r(2, 1, 2, 2, 2), r(2)], attrs=dict(pads=[0, 1, 0, 1, 0, 1]), name="3-d"),
        Sample([r(1, 3, 5), r(3, 1, 2)], attrs=dict(group=3, auto_pad="VALID"), name="depthwise valid"),
    ],
    "ConvTranspose": [
        Sample([r(1, 2, 3, 3), r(2, 3, 3, 3)], attrs=dict(strides=[2, 2], pads=[1, 1, 0, 0], output_padding=[1, 0]),
               name="strides output_padding"),
        Sample([r(1, 4, 3, 3), r(4, 1, 2, 2), r(2)], attrs=dict(group=2), name="groups bias"),
        Sample([r(1, 2, 4), r(2, 2, 3)], attrs=dict(dilations=[2], pads=[1, 2]), name="1-d dilation"),
        Sample([r(1, 1, 4), r(1, 2, 3)], attrs=dict(auto_pad="SAME_UPPER", strides=[2]), name="same upper"),
        Sample([r(1, 1, 3), r(1, 1, 3)], attrs=dict(strides=[2], output_shape=[6]), name="output_shape"),
        Sample([r(1, 1, 2, 2, 2), r(1, 2, 2, 2, 2)], attrs=dict(strides=[2, 2, 2]), name="3-d"),
    ],
    "MaxPool": [
        Sample([distinct(1, 2, 5, 5)], attrs=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), name="pads"),
        Sample([distinct(1, 1, 7, 7)], attrs=dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), name="ceil_mode"),
        Sample([distinct(2, 2, 8)], attrs=dict(kernel_shape=[3], dilations=[2]), name="1-d dilation"),
        Sample([distinct(1, 1, 4, 4, 4)], attrs=dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), name="3-d"),
        Sample([distinct(1, 1, 5, 5)], attrs=dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
               name="same upper"),
        Sample([distinct(1, 2, 4, 4)], attrs=dict(kernel_shape=[2, 2]), n_outputs=2, name="with Indices"),
    ],
    "AveragePool": [
        Sample([r(1, 2, 5, 5)], attrs=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), name="pads"),
        Sample([r(1, 2, 5, 5)], attrs=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
               name="count_include_pad"),
        Sample([r(1, 1, 7, 7)], attrs=dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), name="ceil_mode"),
        Sample([r(1, 1, 6, 7)], attrs=dict(kernel_shape=[3, 2], strides=[2, 3], ceil_mode=1, count_include_pad=1,
                                            pads=[1, 0, 1, 1]), name="ceil_mode count_include_pad"),
        Sample([r(2, 2, 8)], attrs=dict(kernel_shape=[3], strides=[2], auto_pad="SAME_LOWER"), name="1-d same lower"),
        Sample([r(1, 1, 4, 4, 4)], attrs=dict(kernel_shape=[2, 2, 2], strides=[2, 1, 2]), name="3-d"),
    ],
    "GlobalAveragePool": [
        Sample([r(2, 3, 4, 4)], name="2-d"),
        Sample([r(1, 2, 5)], name="1-d"),
    ],
    "GlobalMaxPool": [
        Sample([distinct(2, 3, 3, 3)], name="2-d"),
        Sample([distinct(1, 2, 6)], name="1-d"),
    ],
})


def _resize(x, scales=None, sizes=None, roi=None, opset=17, **attrs):
    f32 = np.float32
    if opset < 11:
        return Sample([x, np.asarray(scales, f32)], attrs=attrs, constants=[1], opset=10,
                      name=f"opset 10 {attrs}")
    ins = [x, None if roi is None else np.asarray(roi, f32), None if scales is None else np.asarray(scales, f32),
           None if sizes is None else np.asarray(sizes, np.int64)]
    return Sample(ins, attrs=attrs, constants=[i for i in (1, 2, 3) if ins[i] is not None], opset=opset,
                  name=f"{attrs} scales={scales} sizes={sizes}")


SAMPLES["Resize"] = [
    _resize(r(1, 1, 3, 3), scales=[1, 1, 2, 2], mode="nearest", coordinate_transformation_mode="asymmetric",
            nearest_mode="floor"),
    _resize(r(1, 1, 4, 6), sizes=[1, 1, 3, 4], mode="nearest", nearest_mode="round_prefer_ceil"),
    _resize(r(1, 2, 4, 6), sizes=[1, 2, 3, 5], mode="linear"),
    _resize(r(1, 1, 4, 4), scales=[1, 1, 1.5, 1.5], mode="linear", coordinate_transformation_mode="align_corners"),
    _resize(r(1, 1, 3, 5), scales=[1, 1, 2, 0.6], mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    _resize(r(1, 1, 4, 4), scales=[1, 1, 2, 2], mode="cubic"),
    _resize(r(1, 1, 4, 5), sizes=[1, 1, 6, 3], mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1),
    _resize(r(1, 1, 4, 4), sizes=[1, 1, 3, 3], roi=[0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2], mode="linear",
            coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=0.5),
    _resize(r(2, 3, 4), scales=[1, 2, 1.5], mode="linear", coordinate_transformation_mode="asymmetric"),
    _resize(r(1, 1, 3, 4), scales=[1, 1, 2, 2], opset=10, mode="linear"),
]

# Upsample (deprecated at opset 10): scales as an attribute (opset 7) or a constant input (opset 9).
SAMPLES["Upsample"] = [
    Sample([r(1, 1, 3, 3)], attrs=dict(mode="nearest", scales=[1.0, 1.0, 2.0, 1.5]), opset=7, name="opset 7 nearest"),
    Sample([r(1, 2, 3, 4)], attrs=dict(mode="linear", scales=[1.0, 1.0, 2.0, 2.5]), opset=8, name="opset 8 linear"),
    Sample([r(2, 3, 4), np.asarray([1, 2, 1.5], np.float32)], attrs=dict(mode="linear"), constants=[1], opset=9,
           name="opset 9 linear"),
    Sample([r(1, 1, 2, 3), np.asarray([1, 1, 3, 2], np.float32)], attrs=dict(mode="bilinear"), constants=[1],
           opset=9, name="opset 9 bilinear"),
    Sample([r(1, 2, 3, 2), np.asarray([1, 1, 2, 3], np.float32)], attrs=dict(mode="nearest"), constants=[1], opset=9,
           name="opset 9 nearest"),
]


def _unpool_indices(n, c, h, w, repeat=False):
    """MaxPool(2x2, stride 2) indices into [n, c, h, w], flattened over the whole tensor: one position
    per window; `repeat` points the last window at the first one's position (the later X wins)."""
    idx = np.zeros((n, c, h // 2, w // 2), np.int64)
    for (b, ch, i, j), _ in np.ndenumerate(idx):
        di, dj = rng.integers(0, 2, 2)
        idx[b, ch, i, j] = ((b * c + ch) * h + 2 * i + di) * w + 2 * j + dj
    if repeat:
        idx[0, 0, -1, -1] = idx[0, 0, 0, 0]
    return idx


SAMPLES["MaxUnpool"] = [
    Sample([r(1, 2, 2, 2), _unpool_indices(1, 2, 4, 4)], attrs=dict(kernel_shape=[2, 2], strides=[2, 2]),
           constants=[1], opset=11, name="2x2 stride 2"),
    Sample([r(2, 1, 2, 3), _unpool_indices(2, 1, 4, 6), np.asarray([2, 1, 5, 7], np.int64)],
           attrs=dict(kernel_shape=[2, 2], strides=[2, 2]), constants=[1, 2], opset=11, name="output_shape"),
    Sample([r(1, 1, 2, 2), _unpool_indices(1, 1, 4, 4, repeat=True)], attrs=dict(kernel_shape=[2, 2], strides=[2, 2]),
           constants=[1], opset=11, name="a repeated index"),
]

# Det: invertible matrices (det * X^-T), a singular one of rank m-1 (the adjugate: no inverse), 1x1.
SAMPLES["Det"] = [
    Sample([r(3, 3)], name="3x3"),
    Sample([r(2, 2, 4, 4)], name="batched 4x4"),
    Sample([np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.5, -1.0, 1.5]])], name="singular rank 2"),
    Sample([r(2, 1, 1)], name="1x1"),
]

# DFT and STFT (src/ops/signal/): real ([..., 1]) and complex ([..., 2]) signals, power-of-two and
# other lengths, onesided, inverse, dft_length padding and cutting, a window that is differentiated.
_i64 = np.int64
SAMPLES["DFT"] = [
    Sample([r(2, 8, 1)], opset=17, name="real, length 8"),
    Sample([r(2, 5, 2)], opset=17, name="complex, length 5"),
    Sample([r(1, 6, 1)], attrs=dict(onesided=1), opset=17, name="real onesided"),
    Sample([r(1, 7, 1)], attrs=dict(onesided=1), opset=17, name="real onesided, odd length"),
    Sample([r(2, 4, 2)], attrs=dict(inverse=1), opset=17, name="complex inverse"),
    Sample([r(1, 5, 1), np.array(8, _i64)], constants=[1], opset=17, name="dft_length pads"),
    Sample([r(1, 6, 2), np.array(4, _i64)], attrs=dict(inverse=1), constants=[1], opset=17, name="dft_length cuts"),
    Sample([r(1, 2, 3, 2)], attrs=dict(axis=2), opset=17, name="axis 2"),
]
SAMPLES["STFT"] = [
    Sample([r(1, 16, 1), np.array(4, _i64), r(8)], constants=[1], opset=17, name="real, window"),
    Sample([r(2, 12, 2), np.array(3, _i64), r(6)], attrs=dict(onesided=0), constants=[1], opset=17,
           name="complex, window, two-sided"),
    Sample([r(1, 10, 1), np.array(2, _i64), None, np.array(4, _i64)], constants=[1, 3], opset=17,
           name="frame_length, no window"),
]

# GridSample: grid points in [-1.3, 1.3], so some fall outside and exercise each padding mode.
def _grid(n, h, w):
    return rng.uniform(-1.3, 1.3, (n, h, w, 2))


SAMPLES["GridSample"] = [
    Sample([r(1, 2, 3, 4), _grid(1, 2, 3)], opset=16, name="bilinear zeros"),
    Sample([r(2, 1, 4, 3), _grid(2, 3, 2)], attrs=dict(align_corners=1), opset=16, name="bilinear zeros aligned"),
    Sample([r(1, 2, 3, 4), _grid(1, 3, 2)], attrs=dict(padding_mode="border"), opset=16, name="bilinear border"),
    Sample([r(1, 1, 4, 4), _grid(1, 3, 3)], attrs=dict(padding_mode="reflection"), opset=16,
           name="bilinear reflection"),
    Sample([r(1, 1, 3, 5), _grid(1, 2, 3)], attrs=dict(padding_mode="reflection", align_corners=1), opset=16,
           name="bilinear reflection aligned"),
    Sample([r(1, 2, 3, 3), _grid(1, 2, 2)], attrs=dict(mode="nearest"), opset=16, name="nearest"),
    Sample([r(1, 1, 4, 4), _grid(1, 2, 2)], attrs=dict(mode="bicubic"), opset=16, name="bicubic zeros"),
    Sample([r(1, 1, 4, 5), _grid(1, 2, 2)], attrs=dict(mode="bicubic", padding_mode="border", align_corners=1),
           opset=16, name="bicubic border aligned"),
    Sample([r(1, 1, 4, 4), _grid(1, 2, 2)], attrs=dict(mode="bicubic", padding_mode="reflection"), opset=16,
           name="bicubic reflection"),
]

# RoiAlign: rois are constants (their gradient has no rule), two rois on one image overlap.
_rois = np.array([[0.3, 0.2, 4.1, 3.6], [1.0, 1.5, 5.2, 4.4], [0.5, 0.0, 2.5, 2.5]])
_batch = np.array([0, 0, 1], np.int64)
SAMPLES["RoiAlign"] = [
    Sample([r(2, 2, 5, 6), _rois, _batch], attrs=dict(output_height=2, output_width=3, sampling_ratio=2),
           constants=[1, 2], opset=16, name="avg half_pixel"),
    Sample([r(2, 1, 5, 6), _rois, _batch], attrs=dict(output_height=2, output_width=2, spatial_scale=0.8),
           constants=[1, 2], opset=10, name="avg output_half_pixel, adaptive samples"),
    Sample([distinct(2, 2, 5, 6), _rois, _batch], attrs=dict(output_height=2, output_width=2, sampling_ratio=2,
                                                            mode="max"),
           constants=[1, 2], opset=16, name="max"),
]
