"""The C++ .npz reader and writer against numpy: files np.savez and np.savez_compressed write
(every supported dtype, .npy versions 1-3, ZIP64 records) are read exactly; files we write load
in numpy and pass zipfile's CRC check; damaged or unsupported files fail with a message naming
the file and the array."""
import io
import subprocess
import zipfile

import numpy as np
import pytest

from .build_paths import NPZ_COPY


def arrays():
    rng = np.random.default_rng(0)
    out = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": np.array([np.nan, np.inf, -0.0, 1e-300, 2.5]),
        "f16": rng.standard_normal(7).astype(np.float16),
        "i64": np.array([[-(2 ** 63), 2 ** 63 - 1], [0, -1]], dtype=np.int64),
        "i32": np.arange(-5, 5, dtype=np.int32).reshape(2, 5),
        "i16": np.array([-300, 300], dtype=np.int16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": rng.integers(0, 256, (2, 3, 4), dtype=np.uint8),
        "u16": np.array([65535], dtype=np.uint16),
        "u32": np.array([4294967295], dtype=np.uint32),
        "u64": np.array([2 ** 64 - 1], dtype=np.uint64),
        "flags": np.array([True, False, True]),
        "scalar": np.float32(3.5),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    out["strided"] = out["f32"][:, ::2]  # written in C order by numpy
    return out


def copy(src, dst, *names):
    return subprocess.run([str(NPZ_COPY), str(src), str(dst), *names], capture_output=True, text=True, timeout=60)


def assert_same(path, expected):
    with np.load(path) as got:
        assert list(got.keys()) == list(expected.keys())
        for name, want in expected.items():
            want = np.asarray(want)
            assert got[name].dtype == want.dtype, name
            assert got[name].shape == want.shape, name
            assert got[name].tobytes() == np.ascontiguousarray(want).tobytes(), name


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_reads_numpy_archives_and_writes_archives_numpy_reads(tmp_path, save):
    data = arrays()
    save(tmp_path / "in.npz", **data)
    r = copy(tmp_path / "in.npz", tmp_path / "out.npz")
    assert r.returncode == 0, r.stderr
    assert_same(tmp_path / "out.npz", data)
    with zipfile.ZipFile(tmp_path / "out.npz") as z:
        assert z.testzip() is None  # every CRC-32 checks


def test_selected_arrays_in_the_order_named(tmp_path):
    np.savez(tmp_path / "in.npz", a=np.arange(3), b=np.ones(2), c=np.zeros(1))
    assert copy(tmp_path / "in.npz", tmp_path / "out.npz", "c", "a").returncode == 0
    with np.load(tmp_path / "out.npz") as got:
        assert list(got.keys()) == ["c", "a"]
    r = copy(tmp_path / "in.npz", tmp_path / "out.npz", "x")
    assert r.returncode == 1 and "no array named 'x' (arrays: a, b, c)" in r.stderr


def test_zip64_end_records_and_extra_fields(tmp_path, monkeypatch):
    # numpy writes ZIP64 end records only past 4 GiB; a lower limit makes zipfile write them now.
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 64)
    data = {"a": np.arange(100, dtype=np.float32), "b": np.arange(50, dtype=np.int64)}
    np.savez(tmp_path / "in.npz", **data)
    raw = (tmp_path / "in.npz").read_bytes()
    assert b"PK\x06\x06" in raw and b"PK\x06\x07" in raw  # the ZIP64 end record and its locator
    assert copy(tmp_path / "in.npz", tmp_path / "out.npz").returncode == 0
    assert_same(tmp_path / "out.npz", data)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_format_versions(tmp_path, version):
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=version)
    (tmp_path / "a.npy").write_bytes(buf.getvalue())
    with zipfile.ZipFile(tmp_path / "in.npz", "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", buf.getvalue())
    for src in ["a.npy", "in.npz"]:
        r = copy(tmp_path / src, tmp_path / "out.npz")
        assert r.returncode == 0, r.stderr
        with np.load(tmp_path / "out.npz") as got:
            np.testing.assert_array_equal(next(iter(got.values())), a)


@pytest.mark.parametrize("value, message", [
    (np.arange(6, dtype=np.float32).reshape(2, 3).T, "Fortran order"),
    (np.arange(3, dtype=">f4"), "big-endian"),
    (np.array(["a", "bc"]), "string arrays are not supported"),
    (np.array([1 + 2j]), "complex arrays are not supported"),
    (np.array([{"a": 1}], dtype=object), "object arrays"),
    (np.zeros(2, dtype=[("x", "<f4"), ("y", "<i4")]), "structured dtypes"),
])
def test_unsupported_arrays_are_named(tmp_path, value, message):
    np.savez(tmp_path / "in.npz", ok=np.zeros(2), bad=value)
    r = copy(tmp_path / "in.npz", tmp_path / "out.npz")
    assert r.returncode == 1
    assert f"npz '{tmp_path / 'in.npz'}': array 'bad': " in r.stderr and message in r.stderr, r.stderr
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("compressed", [False, True])
def test_truncated_archives(tmp_path, compressed):
    save = np.savez_compressed if compressed else np.savez
    save(tmp_path / "in.npz", x=np.arange(1000, dtype=np.float32), y=np.arange(1000))
    raw = (tmp_path / "in.npz").read_bytes()
    for cut in [0, 10, 100, len(raw) // 2, len(raw) - 30, len(raw) - 1]:
        (tmp_path / "cut.npz").write_bytes(raw[:cut])
        r = copy(tmp_path / "cut.npz", tmp_path / "out.npz")
        assert r.returncode == 1 and f"npz '{tmp_path / 'cut.npz'}'" in r.stderr, (cut, r.stderr)


def test_corrupt_deflate_data_names_the_array(tmp_path):
    np.savez_compressed(tmp_path / "in.npz", labels=np.arange(5000) % 7)
    raw = bytearray((tmp_path / "in.npz").read_bytes())
    with zipfile.ZipFile(tmp_path / "in.npz") as z:
        info = z.getinfo("labels.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)  # extra as numpy wrote it locally
    for i in range(start + 20, start + 40):
        raw[i] ^= 0xFF
    (tmp_path / "bad.npz").write_bytes(bytes(raw))
    r = copy(tmp_path / "bad.npz", tmp_path / "out.npz")
    assert r.returncode == 1 and "array 'labels'" in r.stderr, r.stderr
    assert "deflate" in r.stderr or "CRC-32" in r.stderr, r.stderr


def test_other_members_and_non_archives(tmp_path):
    with zipfile.ZipFile(tmp_path / "in.npz", "w") as z:
        z.writestr("notes.txt", "hello")
    r = copy(tmp_path / "in.npz", tmp_path / "out.npz")
    assert r.returncode == 1 and "member 'notes.txt': is not an .npy array" in r.stderr, r.stderr
    np.save(tmp_path / "a.npy", np.ones(3))
    r = copy(tmp_path / "a.npy", tmp_path / "out.npz")
    assert r.returncode == 0
    (tmp_path / "a.npz").write_bytes((tmp_path / "a.npy").read_bytes())
    r = copy(tmp_path / "a.npz", tmp_path / "out.npz")
    assert r.returncode == 1 and "this is an .npy file, not an .npz archive" in r.stderr, r.stderr
