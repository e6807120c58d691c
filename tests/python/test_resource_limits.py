"""Resource limits from Python and from the environment (ONNXTRAIN_MAX_ALLOC,
ONNXTRAIN_MAX_LOOP_ITERATIONS): past them a model fails with onnxtrain.Error naming the limit,
instead of exhausting memory or running forever. Each environment case runs in a fresh process,
since the variables are read once. tests/cpp/resource_limits_test.cc covers the C++ API."""
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxtrain

HERE = os.path.dirname(os.path.abspath(__file__))


def constant_of_shape_model():
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"],
                            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5]))
    g = helper.make_graph([node], "cos", [helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def endless_loop_model():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Add", ["v", "one"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.INT64, [])],
        [helper.make_tensor("one", TensorProto.INT64, [], [1])])
    g = helper.make_graph([helper.make_node("Loop", ["", "cond", "v0"], ["v"], body=body)], "endless",
                          [helper.make_tensor_value_info("v0", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("v", TensorProto.INT64, [])],
                          [helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def run_with_env(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


@pytest.fixture
def restore_limits():
    saved = onnxtrain.resource_limits()
    yield
    onnxtrain.set_resource_limits(**saved)


def test_limits_from_python(restore_limits):
    sess = onnxtrain.InferenceSession(constant_of_shape_model())
    onnxtrain.set_resource_limits(max_alloc_bytes=64 << 20)
    assert onnxtrain.resource_limits()["max_alloc_bytes"] == 64 << 20
    y = sess.run(None, {"shape": np.array([3, 4], np.int64)})[0]
    np.testing.assert_array_equal(y, np.full((3, 4), 1.5, np.float32))
    with pytest.raises(onnxtrain.Error, match="memory limit of 67108864 bytes"):
        sess.run(None, {"shape": np.array([1 << 16, 1 << 15], np.int64)})  # 8 GiB
    onnxtrain.set_resource_limits(max_loop_iterations=50)
    with pytest.raises(onnxtrain.Error, match=r"\[Loop\].*ran 50 iterations without ending"):
        onnxtrain.InferenceSession(endless_loop_model()).run(None, {"v0": np.array(0, np.int64)})


SCRIPT = f"""
import sys
sys.path.insert(0, {os.path.join(HERE, "..", "..", "build", "python")!r})
import numpy as np, onnxtrain
sys.path.insert(0, {HERE!r})
from test_resource_limits import constant_of_shape_model, endless_loop_model
print(onnxtrain.resource_limits())
try:
    onnxtrain.InferenceSession(constant_of_shape_model()).run(None, {{"shape": np.array([1024, 1024], np.int64)}})
    print("alloc ok")
except onnxtrain.Error as e:
    print("alloc error:", e)
try:
    onnxtrain.InferenceSession(endless_loop_model()).run(None, {{"v0": np.array(0, np.int64)}})
except onnxtrain.Error as e:
    print("loop error:", e)
"""


def test_limits_from_the_environment():
    out = run_with_env(SCRIPT, ONNXTRAIN_MAX_ALLOC="1M", ONNXTRAIN_MAX_LOOP_ITERATIONS="20")
    assert out.returncode == 0, out.stderr
    assert "'max_alloc_bytes': 1048576, 'max_loop_iterations': 20" in out.stdout, out.stdout
    assert "alloc error:" in out.stdout and "memory limit of 1048576 bytes (ONNXTRAIN_MAX_ALLOC" in out.stdout, out.stdout
    assert "loop error:" in out.stdout and "ran 20 iterations without ending" in out.stdout, out.stdout
    # 4 MiB allowed: the same 4 MiB tensor fits.
    out = run_with_env(SCRIPT, ONNXTRAIN_MAX_ALLOC="5m")
    assert "alloc ok" in out.stdout, out.stdout + out.stderr


def test_malformed_environment_values_are_errors_naming_the_variable():
    out = run_with_env(SCRIPT, ONNXTRAIN_MAX_ALLOC="lots")
    assert "ONNXTRAIN_MAX_ALLOC='lots': expected a number of bytes, optionally with K, M, G or T" in \
        out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("var,value", [("ONNXTRAIN_MAX_ALLOC", " -1"), ("ONNXTRAIN_MAX_ALLOC", "+1M"),
                                       ("ONNXTRAIN_MAX_ALLOC", " 1M"), ("ONNXTRAIN_MAX_LOOP_ITERATIONS", " 20"),
                                       ("ONNXTRAIN_MAX_LOOP_ITERATIONS", "-5")])
def test_signs_and_leading_spaces_are_errors_not_no_limit(var, value):
    """strtoull reads " -1" as 2^64 - 1 (no limit): every value must begin with a digit."""
    out = run_with_env(SCRIPT, **{var: value})
    assert f"{var}='{value}': expected a" in out.stdout + out.stderr, out.stdout + out.stderr


def test_a_negative_loop_limit_is_an_error_not_no_limit():
    saved = onnxtrain.resource_limits()
    with pytest.raises(onnxtrain.Error, match=r"max_loop_iterations: expected a count >= 0 \(0: no limit\), got -1"):
        onnxtrain.set_resource_limits(max_loop_iterations=-1)
    assert onnxtrain.resource_limits() == saved
