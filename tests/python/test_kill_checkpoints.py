"""Crash consistency, the short run: tests/crash/kill_test.py SIGKILLs training processes of the
Python API, the C++ API and `onnxtrain train` 15 times each at random instants (many inside a
save) and checks after every kill that the checkpoint, the exported model and the CLI's log are
the uninterrupted run's, and that the resumed runs end equal to it bit for bit. `make kill-test`
runs 200 kills per front end (docs/ROBUSTNESS.md). About 40 s."""
import os
import subprocess
import sys
from pathlib import Path

from .build_paths import ONNXTRAIN

KILL_TEST = Path(__file__).resolve().parents[1] / "crash" / "kill_test.py"
CRASH_TRAIN = ONNXTRAIN.parent / "tests" / "crash_train"


def test_checkpoints_exports_and_logs_survive_sigkill_at_random_instants():
    assert CRASH_TRAIN.exists(), f"{CRASH_TRAIN} is not built (make build)"
    r = subprocess.run([sys.executable, str(KILL_TEST), "--kills", "15"], env=dict(os.environ),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    print(r.stdout)
    assert r.returncode == 0, r.stdout  # the seed on its first line reproduces a failure (--seed)
    for front_end in ("python", "cpp", "cli"):
        assert f"{front_end}: " in r.stdout and ", 0 failures," in r.stdout.split(f"{front_end}: ", 1)[1].split("\n")[0]
