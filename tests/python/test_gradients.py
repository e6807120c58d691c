"""Registry-driven gradient checks: every op that claims a gradient rule is checked by finite
differences on its samples, and an op with a rule but no samples fails the suite."""
import numpy as np
import pytest

import onnxtrain

from .gradcheck import check, collect_samples

SAMPLES = collect_samples()


def differentiable_ops():
    return sorted({(o["domain"] + "." if o["domain"] else "") + o["op_type"]
                   for o in onnxtrain.registered_ops() if o["gradient"] == "differentiable"})


def test_every_differentiable_op_has_samples():
    missing = [op for op in differentiable_ops() if not SAMPLES.get(op)]
    assert not missing, f"ops with a gradient rule but no gradcheck samples: {missing}"


@pytest.mark.parametrize("op", differentiable_ops())
def test_gradient_matches_finite_differences(op):
    for k, sample in enumerate(SAMPLES.get(op, [])):
        op_type = op.split(".")[-1]
        check(op_type, sample, seed=1000 + k)
