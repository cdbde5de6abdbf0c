"""Where the tests, checks and benchmarks find the real treebank they use (a CoNLL-U file).

One setting decides it: the environment variable ``SYNTAXKERNELS_UD`` names the file (UD English-EWT dev,
``en_ewt-ud-dev.conllu``, is what the recorded figures use; any CoNLL-U file works). The project never looks
for it anywhere else and downloads nothing: without the variable, tests and checks skip and benchmarks fall
back to generated trees, each saying how to provide it (:func:`missing_message`).

    SYNTAXKERNELS_UD=/data/ud/en_ewt-ud-dev.conllu python -m pytest python_tests
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["ENV_VAR", "TreebankNotFound", "treebank_path", "treebank_available",
           "require_treebank", "missing_message"]

#: The environment variable naming the treebank file.
ENV_VAR = "SYNTAXKERNELS_UD"

_FILE_NAME = "en_ewt-ud-dev.conllu"


class TreebankNotFound(FileNotFoundError):
    """The treebank file is not where :func:`treebank_path` says; the message tells how to provide it."""


def treebank_path() -> Optional[Path]:
    """The treebank file named by ``$SYNTAXKERNELS_UD``, or None when the variable is unset (or empty).

    Read at every call, so setting the variable inside a running process takes effect.
    """
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value).expanduser() if value else None


def treebank_available() -> bool:
    """True when :func:`treebank_path` names an existing file."""
    path = treebank_path()
    return path is not None and path.is_file()


def missing_message(path: Optional[Path] = None) -> str:
    """One sentence: why no treebank is used, and how to provide one."""
    path = treebank_path() if path is None else Path(path)
    if path is None:
        where = f"no treebank: {ENV_VAR} is unset"
    else:
        where = f"{ENV_VAR}={path} does not name an existing file"
    return (f"{where}; set {ENV_VAR} to a CoNLL-U file (UD English-EWT dev, {_FILE_NAME}, from "
            "universaldependencies.org, is the one the recorded figures use) to include it")


def require_treebank() -> Path:
    """The treebank's path; raises :class:`TreebankNotFound` (with :func:`missing_message`) when absent."""
    path = treebank_path()
    if path is None or not path.is_file():
        raise TreebankNotFound(missing_message(path))
    return path
