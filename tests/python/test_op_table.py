"""docs/OPS.md (the op table with kernel and gradient status) is what the registry says today."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_op_table_is_current():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "op_table.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"docs/OPS.md is stale: run tools/op_table.py\n{r.stdout}{r.stderr}"
