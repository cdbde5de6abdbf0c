"""Where the tests, checks and benchmarks find the real treebank they use (a CoNLL-U file).

One setting decides it: the environment variable ``SYNTAXKERNELS_UD`` names the file (UD English-EWT dev,
``en_ewt-ud-dev.conllu``, is what the recorded figures use; any CoNLL-U file works). When the variable is
unset, the file is looked for at ``<repository>/../shared/data/ud/en_ewt-ud-dev.conllu``. Nothing is
downloaded: without the file, tests and checks skip and benchmarks fall back to generated trees, each saying
how to provide it (:func:`missing_message`).

    SYNTAXKERNELS_UD=/data/ud/en_ewt-ud-dev.conllu python -m pytest python_tests
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "TreebankNotFound", "default_treebank_path", "treebank_path", "treebank_available",
           "require_treebank", "missing_message"]

#: The environment variable naming the treebank file.
ENV_VAR = "SYNTAXKERNELS_UD"

_FILE_NAME = "en_ewt-ud-dev.conllu"


class TreebankNotFound(FileNotFoundError):
    """The treebank file is not where :func:`treebank_path` says; the message tells how to provide it."""


def default_treebank_path() -> Path:
    """``<repository>/../shared/data/ud/en_ewt-ud-dev.conllu`` (where it is looked for when the variable is unset)."""
    repository = Path(__file__).resolve().parents[1]
    return repository.parent / "shared" / "data" / "ud" / _FILE_NAME


def treebank_path() -> Path:
    """The treebank file: ``$SYNTAXKERNELS_UD`` when set (and not empty), else :func:`default_treebank_path`.

    Read at every call, so setting the variable inside a running process takes effect.
    """
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value).expanduser() if value else default_treebank_path()


def treebank_available() -> bool:
    """True when :func:`treebank_path` is an existing file."""
    return treebank_path().is_file()


def missing_message(path: Path | None = None) -> str:
    """One sentence: where the treebank was looked for, and how to provide it."""
    path = treebank_path() if path is None else Path(path)
    value = os.environ.get(ENV_VAR, "").strip()
    if value and path == Path(value).expanduser():
        where = f"{ENV_VAR}={value} does not name an existing file"
    elif not value and path == default_treebank_path():
        where = f"treebank not found at {path} ({ENV_VAR} is unset)"
    else:
        where = f"treebank not found at {path}"
    return (f"{where}; set {ENV_VAR} to a CoNLL-U file (UD English-EWT dev, {_FILE_NAME}, from "
            "universaldependencies.org, is the one the recorded figures use) to include it")


def require_treebank() -> Path:
    """The treebank's path; raises :class:`TreebankNotFound` (with :func:`missing_message`) when absent."""
    path = treebank_path()
    if not path.is_file():
        raise TreebankNotFound(missing_message(path))
    return path
