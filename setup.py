"""Builds the onnxtrain Python package with CMake: `python3 -m pip install --no-build-isolation .`

The compiled part (the extension onnxtrain._C, libonnxtrain and the `onnxtrain` command line) is
built by CMake with the flags `make build` uses (Release, Ninja, ccache when installed), so a
machine that has built the project before gets compiler-cache hits, and is put in the package by
`cmake --install --component python` (cmake/install.cmake): onnxtrain/_C*.so, onnxtrain/lib/ and
onnxtrain/bin/, found through RPATH $ORIGIN. pyproject.toml holds the metadata.

Environment:
  ONNXTRAIN_CMAKE_BUILD_DIR   take the compiled files from this existing CMake build directory
                              (brought up to date, not reconfigured; `make` builds one in build/)
                              instead of configuring build-pip/
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: the number of CPUs)
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# One level below the root, like build/: ccache (base_dir) then sees the same relative paths as
# in `make`'s build and reuses its objects.
DEFAULT_BUILD_DIR = ROOT / "build-pip"
MIN_CMAKE = (3, 22)

# What the build runs, with the Debian package that provides it (scripts/install_deps.sh installs all).
PROGRAMS = {"cmake": "cmake", "ninja": "ninja-build", "cc": "gcc", "c++": "g++"}
HEADERS = {
    "google/protobuf/message.h": "libprotobuf-dev",
    "onnx/onnx_pb.h": "libonnx-dev",
    "oneapi/dnnl/dnnl.hpp": "libdnnl-dev",
    "zlib.h": "zlib1g-dev",
    "dlpack/dlpack.h": "libdlpack-dev",
    "Python.h": "python3-dev",
    "pybind11/pybind11.h": "pybind11-dev",
}


def cmake_version(cmake: str) -> tuple:
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def header_found(compiler: str, header: str) -> bool:
    """Whether the compiler finds <header> (the Python headers' folder added, as CMake adds it)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cc"
        probe.write_text(f"#include <{header}>\n")
        r = subprocess.run([compiler, "-E", "-DONNX_ML=1", "-DONNX_NAMESPACE=onnx",
                            f"-I{sysconfig.get_paths()['include']}", str(probe), "-o", os.devnull],
                           capture_output=True)
        return r.returncode == 0


def numpy_found() -> bool:
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


def missing_build_dependencies(which=shutil.which, has_header=header_found, has_numpy=numpy_found,
                               version_of=cmake_version, headers_needed=True) -> list:
    """(what, Debian package) for everything the build needs and this machine lacks."""
    missing = [(f"the {p} command", pkg) for p, pkg in PROGRAMS.items() if which(p) is None]
    cmake = which("cmake")
    if cmake is not None and version_of(cmake) < MIN_CMAKE:
        missing.append((f"CMake {MIN_CMAKE[0]}.{MIN_CMAKE[1]} or newer", "cmake (Debian 12 or newer)"))
    if not headers_needed:
        return missing
    compiler = which(os.environ.get("CXX", "c++"))
    if compiler is None:
        missing.append(("the headers (not checked: no C++ compiler)", ", ".join(sorted(set(HEADERS.values())))))
    else:
        missing += [(f"<{h}>", pkg) for h, pkg in HEADERS.items() if not has_header(compiler, h)]
    if not has_numpy():
        missing.append((f"numpy for {sys.executable}", "python3-numpy"))
    return missing


def missing_dependencies_message(missing: list) -> str:
    packages = []
    for _, pkg in missing:
        for p in pkg.split(", "):
            name = p.split(" ")[0]
            if name not in packages:
                packages.append(name)
    lines = ["onnxtrain cannot be built: this machine lacks"]
    lines += [f"  {what}: Debian package{'s' if ', ' in pkg else ''} {pkg}" for what, pkg in missing]
    lines += ["Install them with", f"  sudo apt-get install {' '.join(packages)}",
              "or run scripts/install_deps.sh from onnxtrain's sources, which installs every package",
              "the project uses; then run pip again."]
    return "\n".join(lines)


def run(cmd: list, env: dict) -> None:
    command = " ".join(map(str, cmd))
    print(f"+ {command}", flush=True)
    r = subprocess.run([str(c) for c in cmd], env=env)
    if r.returncode != 0:  # its own output says why; no Python traceback on top
        raise SystemExit(f"onnxtrain build: `{command}` exited with status {r.returncode}")


def check_build_dependencies() -> None:
    """Stops the build with the Debian packages to install when something is missing."""
    missing = missing_build_dependencies(headers_needed=not os.environ.get("ONNXTRAIN_CMAKE_BUILD_DIR"))
    if missing:
        raise SystemExit(missing_dependencies_message(missing))


def build_compiled_part(destination: Path) -> None:
    """Builds with CMake and installs the compiled files under destination/onnxtrain/."""
    existing = os.environ.get("ONNXTRAIN_CMAKE_BUILD_DIR")
    cmake = shutil.which("cmake")
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", str(ROOT.parent))  # as the Makefile sets it
    if existing:
        build_dir = Path(existing).resolve()
        if not (build_dir / "CMakeCache.txt").is_file():
            raise SystemExit(f"ONNXTRAIN_CMAKE_BUILD_DIR={existing}: not a configured CMake build directory "
                             "(no CMakeCache.txt); run `make build` or unset it")
        if "ONNXTRAIN_BUILD_PYTHON:BOOL=OFF" in (build_dir / "CMakeCache.txt").read_text():
            raise SystemExit(f"ONNXTRAIN_CMAKE_BUILD_DIR={existing} was configured with ONNXTRAIN_BUILD_PYTHON=OFF: "
                             "it has no Python extension; use a build with it ON, or unset the variable")
    else:
        build_dir = DEFAULT_BUILD_DIR
        configure = [cmake, "-S", ROOT, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython3_EXECUTABLE={sys.executable}", "-DONNXTRAIN_BUILD_PYTHON=ON",
                     "-DONNXTRAIN_BUILD_TESTS=OFF", "-DONNXTRAIN_BUILD_EXAMPLES=OFF"]
        if shutil.which("ccache"):
            configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
        run(configure, env)
    jobs = env.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    run([cmake, "--build", build_dir, "-j", jobs, "--target", "onnxtrain", "onnxtrain_cli", "_C"], env)
    run([cmake, "--install", build_dir, "--component", "python", "--prefix", destination], env)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not (destination / "onnxtrain" / f"_C{suffix}").is_file():
        built = sorted(p.name for p in (destination / "onnxtrain").glob("_C*"))
        raise SystemExit(f"{build_dir} built the extension for another Python ({', '.join(built) or 'none'}); "
                         f"{sys.executable} needs _C{suffix}. Configure it with "
                         f"-DPython3_EXECUTABLE={sys.executable}, or unset ONNXTRAIN_CMAKE_BUILD_DIR.")


def project_version() -> str:
    m = re.search(r"project\(onnxtrain VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    if not m:
        raise SystemExit("setup.py: no 'project(onnxtrain VERSION x.y.z' in CMakeLists.txt")
    return m.group(1)


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it for the checks
    from setuptools import Extension, setup
    from setuptools.command.build import build
    from setuptools.command.build_ext import build_ext

    class CheckedBuild(build):
        """Checks the build dependencies before any step, so a missing one is the first thing said."""

        def run(self):
            check_build_dependencies()
            super().run()

    class CMakeBuild(build_ext):
        """Builds every extension (there is one: onnxtrain._C) by running CMake once."""

        def run(self):
            if self.inplace:
                raise SystemExit("editable installs are not supported: use PYTHONPATH=build/python after "
                                 "`make build`, or a regular `pip install --no-build-isolation .`")
            build_compiled_part(Path(self.build_lib).resolve())

    setup(
        version=project_version(),
        package_dir={"": "python"},
        packages=["onnxtrain", "onnxtrain.torch"],
        ext_modules=[Extension("onnxtrain._C", sources=[])],
        cmdclass={"build": CheckedBuild, "build_ext": CMakeBuild},
        options={"build": {"build_base": str(DEFAULT_BUILD_DIR / "setuptools")}},
    )
