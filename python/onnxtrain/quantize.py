"""Weight-only block quantization (int4/int8) of fp32 MatMul/Gemm weights into ONNX Runtime's
com.microsoft.MatMulNBits, the same transformation as `onnxtrain quantize` and C++
onnxtrain::quantize (include/onnxtrain/quantize.h).

    from onnxtrain.quantize import quantize
    report = quantize("model.onnx", "model_int4.onnx", bits=4, block_size=32)
    print(report["table"])          # per layer: K, N, relative error ||W - Wq|| / ||W||
"""
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from . import _C, _model_arg


def quantize_model(model: Any, bits: int = 4, block_size: int = 32, symmetric: bool = False,
                   exclude: Sequence[str] = ()) -> Tuple[bytes, Dict[str, Any]]:
    """Quantizes a model (path, bytes or onnx.ModelProto); returns (serialized model, report). The
    report has "layers" (node, weight, K, N, relative_error), "skipped", byte counts and "table"."""
    data = _model_arg(model)
    if isinstance(data, str):
        with open(data, "rb") as f:
            data = f.read()
    return _C.quantize_model(data, int(bits), int(block_size), bool(symmetric), list(exclude))


def quantize(model: Any, output_path: Optional[str] = None, bits: int = 4, block_size: int = 32,
             symmetric: bool = False, exclude: Sequence[str] = ()) -> Dict[str, Any]:
    """Quantizes and writes the model to output_path (when given); returns the report (with the
    serialized model under "model")."""
    data, report = quantize_model(model, bits, block_size, symmetric, exclude)
    if output_path:
        with open(output_path, "wb") as f:
            f.write(data)
    report["model"] = data
    return report
