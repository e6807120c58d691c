"""The package as users get it: `import onnxtrain` reaches its submodules; `pip install
--no-build-isolation .` into a fresh --system-site-packages venv, after which, from another
directory, the package runs a model and the `onnxtrain` command works; a wheel builds; a machine
without the build dependencies is told which Debian packages to install.

The pip and wheel builds take the compiled files from build/ (ONNXTRAIN_CMAKE_BUILD_DIR), so they
compile nothing; build/ must be built (make build)."""
import importlib.util
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from .build_paths import BUILD

ROOT = Path(__file__).resolve().parents[2]


def load_setup_py():
    spec = importlib.util.spec_from_file_location("onnxtrain_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: defines the checks, does not call setup()
    return module


def clean_env(**extra):
    """This environment without the in-tree package on the path (the Makefile exports PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra)
    return env


def run(cmd, timeout=300, check=True, **kwargs):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check:
        assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def test_import_reaches_submodules_and_torch_stays_lazy():
    code = textwrap.dedent("""
        import sys
        import onnxtrain
        assert callable(onnxtrain.autodiff.build_gradient_graph)
        assert callable(onnxtrain.artifacts.generate_artifacts)
        assert isinstance(onnxtrain.api.Module, type)
        assert "torch" not in sys.modules, "import onnxtrain imported torch"
        assert onnxtrain.torch.TrainModule.__name__ == "TrainModule"
        assert "torch" in sys.modules
        try:
            onnxtrain.no_such_thing
        except AttributeError as e:
            assert "no attribute 'no_such_thing'" in str(e), e
        else:
            raise AssertionError("onnxtrain.no_such_thing did not raise")
    """)
    run([sys.executable, "-c", code], env=clean_env(PYTHONPATH=str(BUILD / "python")))


# A model through InferenceSession and its gradient graph, checked against numpy.
USE_INSTALLED = textwrap.dedent("""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import onnxtrain, onnxtrain.autodiff

    w = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.array([[1.0, -1.0]], dtype=np.float32)
    (s,) = onnxtrain.InferenceSession(model).run(None, {"x": x})
    assert np.isclose(s, (x @ w).sum()), s
    grad_model = onnxtrain.autodiff.build_gradient_graph(model, wrt=["w"], outputs=["s"])
    s2, dw = onnxtrain.InferenceSession(grad_model).run(["s", "w_grad"], {"x": x})
    np.testing.assert_allclose(dw, np.repeat(x.T, 2, axis=1))  # d sum(x @ w) / dw[i, j] = x[i]
    print(onnxtrain.__file__)
    print(next(line.split()[-1] for line in open("/proc/self/maps") if "libonnxtrain.so" in line))
""")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv seeing Debian's packages, with onnxtrain pip-installed from the source tree."""
    assert (BUILD / "CMakeCache.txt").is_file(), f"{BUILD} is not a CMake build directory: run `make build`"
    path = tmp_path_factory.mktemp("install") / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", path])
    # --no-cache-dir: each run's wheel would otherwise be kept in pip's cache.
    run([path / "bin" / "python", "-m", "pip", "install", "--no-build-isolation", "--no-cache-dir", ROOT],
        env=clean_env(ONNXTRAIN_CMAKE_BUILD_DIR=str(BUILD)))
    return path


def test_pip_install_runs_from_another_directory(venv, tmp_path):
    r = run([venv / "bin" / "python", "-c", USE_INSTALLED], cwd=tmp_path, env=clean_env())
    package_file, library = r.stdout.split()
    site = str(venv / "lib")
    assert package_file.startswith(site), f"imported {package_file}, not the installed package"
    assert library.startswith(site), f"loaded {library}, not the library inside the installed package"


def test_pip_install_puts_the_command_line_on_path(venv, tmp_path):
    env = clean_env(PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    r = run(["onnxtrain", "--help"], cwd=tmp_path, env=env)
    assert "usage: onnxtrain <command>" in r.stdout and "artifacts" in r.stdout
    # Exit statuses pass through the console script: 2 for wrong arguments.
    r = run(["onnxtrain", "no-such-command"], cwd=tmp_path, env=env, check=False)
    assert r.returncode == 2 and "unknown command 'no-such-command'" in r.stderr


def test_wheel_holds_the_compiled_part(tmp_path):
    run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", tmp_path, ROOT],
        env=clean_env(ONNXTRAIN_CMAKE_BUILD_DIR=str(BUILD)))
    (wheel,) = tmp_path.glob("onnxtrain-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
        cli_mode = z.getinfo("onnxtrain/bin/onnxtrain").external_attr >> 16
    assert {"onnxtrain/__init__.py", "onnxtrain/torch/train_module.py"} <= names
    assert any(n.startswith("onnxtrain/_C.") and n.endswith(".so") for n in names), sorted(names)
    assert any(n.startswith("onnxtrain/lib") and n.endswith("/libonnxtrain.so") for n in names), sorted(names)
    assert cli_mode & 0o111, f"onnxtrain/bin/onnxtrain is not executable in the wheel (mode {cli_mode:o})"
    assert "onnxtrain = onnxtrain._cli:main" in entry_points


def test_pip_without_build_tools_names_the_debian_packages(venv, tmp_path):
    # Only the venv on PATH: no cmake, ninja or compiler.
    r = run([venv / "bin" / "python", "-m", "pip", "install", "--no-build-isolation", ROOT], check=False,
            cwd=tmp_path, env=clean_env(PATH=str(venv / "bin")))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    for expected in ("cannot be built", "the cmake command: Debian package cmake", "ninja-build", "g++",
                     "scripts/install_deps.sh", "sudo apt-get install cmake ninja-build gcc g++"):
        assert expected in out, f"'{expected}' not in pip's output:\n{out}"
    assert "CMake Error" not in out


def test_cmake_without_dependencies_names_the_debian_packages(tmp_path):
    # The system header folder hidden from CMake's find_* calls: every header dependency is missing.
    r = run(["cmake", "-S", ROOT, "-B", tmp_path / "build", "-G", "Ninja", "-DCMAKE_IGNORE_PATH=/usr/include"],
            check=False)
    assert r.returncode != 0
    for expected in ("onnxtrain cannot be built", "header google/protobuf/message.h: Debian package libprotobuf-dev",
                     "oneapi/dnnl/dnnl.hpp: Debian package libdnnl-dev", "pybind11-dev", "libgtest-dev",
                     "scripts/install_deps.sh"):
        assert expected in r.stderr, f"'{expected}' not in CMake's output:\n{r.stderr}"
    assert "Could NOT find" not in r.stderr


def test_missing_dependencies_are_named_with_their_packages():
    setup_py = load_setup_py()
    found = dict(which=lambda p: f"/usr/bin/{p}", has_header=lambda compiler, h: True, has_numpy=lambda: True,
                 version_of=lambda cmake: (3, 25))
    assert setup_py.missing_build_dependencies(**found) == []

    missing = setup_py.missing_build_dependencies(**{
        **found, "which": lambda p: None if p == "ninja" else f"/usr/bin/{p}",
        "has_header": lambda compiler, h: h != "oneapi/dnnl/dnnl.hpp", "version_of": lambda cmake: (3, 18)})
    assert missing == [("the ninja command", "ninja-build"), ("CMake 3.22 or newer", "cmake (Debian 12 or newer)"),
                       ("<oneapi/dnnl/dnnl.hpp>", "libdnnl-dev")]
    message = setup_py.missing_dependencies_message(missing)
    assert "sudo apt-get install ninja-build cmake libdnnl-dev\n" in message
    assert "scripts/install_deps.sh" in message


def test_header_probe_uses_the_compiler():
    setup_py = load_setup_py()
    compiler = setup_py.shutil.which("c++")
    assert compiler, "no c++ on PATH"
    assert setup_py.header_found(compiler, "zlib.h")
    assert setup_py.header_found(compiler, "Python.h")  # from the interpreter's include folder
    assert not setup_py.header_found(compiler, "onnxtrain_no_such_header.h")
    # The machine that built build/ has everything the build needs.
    assert setup_py.missing_build_dependencies() == []
