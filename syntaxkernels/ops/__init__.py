"""Fused ops: one file per op (Triton kernels -> launcher -> autograd.Function -> public function)."""
from .bias_attention import syntax_bias_attention
from .subnetwork_attention import syntax_subnetwork_attention

__all__ = ["syntax_bias_attention", "syntax_subnetwork_attention"]
