"""The peers: engines onnxtrain is checked and timed against, each in a pinned virtual environment
that scripts/setup_peers.sh creates outside the repository. A peer runs in its own interpreter, in a
subprocess, so one process never holds two ONNX Runtimes or two torches.

    python = peers.ensure("ort")        # installs the peer when missing (idempotent, offline once done)
    peers.ort_run(model_path, feeds)    # the model's outputs from ONNX Runtime
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(REPO_ROOT, "scripts", "setup_peers.sh")
ORT_RUNNER = os.path.join(REPO_ROOT, "bench", "ort_runner.py")

# name -> the package it holds (what a failure names); the pins live in scripts/setup_peers.sh.
PACKAGES = {
    "ort": "onnxruntime 1.31",
    "ort-training": "onnxruntime-training-cpu 1.19.2",
    "ortmodule": "onnxruntime-training-cpu 1.19.2's ORTModule on Debian's torch 1.13",
    "torch2": "torch 2.x with transformers 5 and peft",
    "hf113": "transformers 4.47 and peft on Debian's torch 1.13",
}


class PeerMissing(RuntimeError):
    """A peer is not installed, or its install failed; the message says how to install it."""


def peers_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("ONNXTRAIN_PEERS_DIR") or os.path.join(cache, "onnxtrain", "peers")


def _install_hint(name: str) -> str:
    return f"the '{name}' peer ({PACKAGES[name]}, venv {os.path.join(peers_dir(), name)}); install it with `scripts/setup_peers.sh {name}`"


def python(name: str) -> str:
    """The interpreter of an installed peer; PeerMissing when it is not installed."""
    if name not in PACKAGES:
        raise ValueError(f"unknown peer '{name}' (known: {', '.join(PACKAGES)})")
    exe = os.path.join(peers_dir(), name, "bin", "python")
    if not os.path.isfile(os.path.join(peers_dir(), name, ".onnxtrain-peer")) or not os.access(exe, os.X_OK):
        raise PeerMissing(f"{_install_hint(name)} is missing")
    return exe


def lane_of_interpreter() -> str:
    """"torch2" when this interpreter is the torch2 peer's venv, else "debian" (Debian's Python)."""
    here = os.path.realpath(sys.prefix)
    return "torch2" if here == os.path.realpath(os.path.join(peers_dir(), "torch2")) else "debian"


def ensure(name: str, timeout_s: float = 3600) -> str:
    """Installs the peer when missing or stale (scripts/setup_peers.sh NAME) and returns its
    interpreter; PeerMissing, with the installer's output, when that fails."""
    if name not in PACKAGES:
        raise ValueError(f"unknown peer '{name}' (known: {', '.join(PACKAGES)})")
    proc = subprocess.run(["bash", SETUP, name], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise PeerMissing(f"{_install_hint(name)}: the install failed (exit {proc.returncode}):\n"
                          f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    return python(name)


def run(name: str, args: List[str], timeout_s: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """Runs `python ARGS` in the peer's interpreter (installed already); captures text output."""
    return subprocess.run([python(name), *args], capture_output=True, text=True, timeout=timeout_s, **kwargs)


def ort_run(model_path: str, feeds: Dict[str, np.ndarray], workdir: Optional[str] = None, threads: int = 1,
            timeout_s: float = 300) -> List[np.ndarray]:
    """Runs the model once in ONNX Runtime (the `ort` peer, bench/ort_runner.py); returns its
    outputs in graph order."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        report = ort_time(model_path, feeds, tmp, threads=threads, warmup=0, runs=1, save_outputs=True,
                          timeout_s=timeout_s)
        return [np.load(o["file"]) for o in report["outputs"]]


def ort_time(model_path: str, feeds: Dict[str, np.ndarray], workdir: str, threads: int = 1, warmup: int = 5,
             runs: int = 20, budget_ms: Optional[float] = None, gap_ms: float = 0.0, save_outputs: bool = False,
             timeout_s: float = 600) -> dict:
    """Times the model in ONNX Runtime (the `ort` peer); returns ort_runner.py's report (median_ms,
    times_ms, ort_version, outputs, ...). With save_outputs, each output's .npy file is under workdir."""
    cmd = [ORT_RUNNER, "--model", model_path, "--threads", str(threads), "--warmup", str(warmup),
           "--runs", str(runs)]
    if budget_ms is not None:
        cmd += ["--budget-ms", str(budget_ms)]
    if gap_ms > 0:
        cmd += ["--gap-ms", str(gap_ms)]
    if save_outputs:
        cmd += ["--save-outputs", os.path.join(workdir, "ort_outputs")]
    for i, (name, value) in enumerate(feeds.items()):
        file = os.path.join(workdir, f"input{i}.npy")
        np.save(file, np.asarray(value))
        cmd += ["--input", f"{name}={file}"]
    proc = run("ort", cmd, timeout_s=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"ONNX Runtime ({PACKAGES['ort']}) failed on {model_path}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
