import os
import sys

# The package is importable from build/python after a build; PYTHONPATH may point elsewhere.
_BUILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "python")
if _BUILD not in sys.path:
    sys.path.append(_BUILD)
