"""Whether Triton's interpreter is on: the package's one read of ``TRITON_INTERPRET``.

Imports neither torch nor Triton, so the command line can ask before loading them (it re-runs itself with the
interpreter switched on or off, in the environment :func:`environment` gives). Triton reads the variable when
it is first imported: set it before that.
"""
import os
from typing import Dict

VARIABLE = "TRITON_INTERPRET"
#: The values Triton 3.6 reads as on (any case): the package must agree with Triton, which decides.
_ON = ("1", "y", "yes", "on", "true")


_INTERPRETING = None


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (or another value Triton reads as on): the Triton kernels run on CPU
    tensors, in Python. Read once, as Triton reads it once (when it is imported); the hot paths ask often."""
    global _INTERPRETING
    if _INTERPRETING is None:
        _INTERPRETING = os.environ.get(VARIABLE, "").lower() in _ON
    return _INTERPRETING


def setting() -> str:
    """The variable's value as set, or ``"unset"`` (what ``python -m syntaxkernels info`` shows)."""
    return os.environ.get(VARIABLE, "unset")


def environment(interpret: bool) -> Dict[str, str]:
    """This process's environment with the interpreter switched on (``TRITON_INTERPRET=1``) or off (the variable
    removed): the environment of a fresh process that must run the kernels under it, or compile them for a GPU."""
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if interpret:
        env[VARIABLE] = "1"
    return env
