"""Integrations with model libraries.

- :mod:`syntaxkernels.integrations.transformers`: ``enable_syntax_attention(model, method=...)`` turns a
  transformers BERT, RoBERTa or XLM-RoBERTa model into a syntax-aware one in one call, and
  ``load_syntax_model`` reloads what ``save_pretrained`` wrote.

Each integration is imported on first use, so ``import syntaxkernels`` never imports transformers.
"""
from __future__ import annotations

import importlib

__all__ = ["transformers"]


def __getattr__(name):
    if name == "transformers":
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'syntaxkernels.integrations' has no attribute {name!r}")
