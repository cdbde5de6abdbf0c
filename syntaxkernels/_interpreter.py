"""Whether Triton's interpreter is on: the package's one read of ``TRITON_INTERPRET``.

Imports neither torch nor Triton, so the command line can ask before loading them (it re-runs itself with the
interpreter switched on or off). Triton reads the variable when it is first imported: set it before that.
"""
import os


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1``: the Triton kernels run on CPU tensors, in Python."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
