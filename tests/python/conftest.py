import os
import sys

# The package is importable from build/python after a build; PYTHONPATH may point elsewhere.
_BUILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "python")
if _BUILD not in sys.path:
    sys.path.append(_BUILD)

# The peers (bench/peers.py): engines in pinned venvs that scripts/setup_peers.sh creates.
_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)

import pytest  # noqa: E402

import peers  # noqa: E402


def _peer(name):
    """Installs the peer (idempotent, offline once done) or fails the test naming the venv, the
    package and the command that installs it: a missing peer is never a silent skip."""
    try:
        return peers.ensure(name)
    except peers.PeerMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def ort_peer():
    """ONNX Runtime 1.31 (the `ort` peer): call peers.ort_run(model_path, feeds) once this is up."""
    return _peer("ort")


@pytest.fixture(scope="session")
def ort_training_peer():
    """onnxruntime-training-cpu 1.19.2 (the `ort-training` peer): its interpreter."""
    return _peer("ort-training")


@pytest.fixture(scope="session")
def torch2_peer():
    """PyTorch 2.x from PyPI (the `torch2` peer): its interpreter."""
    return _peer("torch2")


@pytest.fixture(scope="session")
def torch_lane():
    """The torch lane this run is meant to be: ONNXTRAIN_TORCH_LANE when set (`make test` sets it
    for each lane), else the interpreter's: "torch2" in the torch2 peer's venv, "debian" elsewhere."""
    return os.environ.get("ONNXTRAIN_TORCH_LANE") or peers.lane_of_interpreter()
