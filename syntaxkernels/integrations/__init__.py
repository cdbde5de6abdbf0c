"""Integrations with model libraries.

- :mod:`syntaxkernels.integrations.transformers`: ``enable_syntax_attention(model, method=...)`` turns a
  transformers encoder (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT) or decoder-only language model
  (GPT-2, Llama, Mistral, Qwen2, Qwen3; method "bias") into a syntax-aware one in one call, and
  ``load_syntax_model`` reloads what ``save_pretrained`` wrote.
- :mod:`syntaxkernels.integrations.upos`: ``token_pos_ids``, the GAT's POS input from parsed sentences and a
  tokenizer's word ids (needs torch only).
- :mod:`syntaxkernels.integrations.checkpoint`: reading the syntax parameters back from a saved checkpoint.

Each module is imported on first use, so ``import syntaxkernels`` never imports transformers.
"""
from __future__ import annotations

import importlib

__all__ = ["transformers", "upos", "checkpoint"]


def __getattr__(name):
    if name in __all__:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'syntaxkernels.integrations' has no attribute {name!r}")
