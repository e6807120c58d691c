"""The programs a build puts in build/ that the tests run."""
from pathlib import Path

BUILD = Path(__file__).resolve().parents[2] / "build"
ONNXTRAIN = BUILD / "onnxtrain"                 # the command line
NPZ_COPY = BUILD / "tests" / "npz_copy"         # reads an .npz with our reader, writes it with our writer
TRAIN_DIGITS = BUILD / "examples" / "train_digits"
LIBRARY = BUILD / "libonnxtrain.so"             # the C API (include/onnxtrain/c_api.h)
