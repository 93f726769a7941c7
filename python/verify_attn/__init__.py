"""verify_attn: attention for the verify step of tree speculative decoding.

Every draft token of a request attends to the request's whole committed prefix
(in a flat or paged KV cache) plus its ancestors in the draft tree, given as a
compact bit mask. See the README for the semantics and the API.
"""

from ._version import __version__
from .runtime import runtime_info
from . import masks, reference
from .attention import plan_info, tree_attention_flat, tree_attention_paged
from .plan import TreeAttentionPlan, Tuning
from .verify_metadata import VerifyMetadata, uniform_verify_metadata
from .reference import (
    gather_paged_kv,
    reference_attention_bruteforce,
    reference_attention_flat,
    reference_attention_paged,
)
from . import errors
from .errors import KernelInputError, check_errors, ensure_error_buffer, set_debug

__all__ = [
    "__version__",
    "runtime_info",
    "masks",
    "reference",
    "tree_attention_flat",
    "tree_attention_paged",
    "plan_info",
    "TreeAttentionPlan",
    "Tuning",
    "VerifyMetadata",
    "uniform_verify_metadata",
    "gather_paged_kv",
    "reference_attention_flat",
    "reference_attention_paged",
    "reference_attention_bruteforce",
    "errors",
    "KernelInputError",
    "check_errors",
    "ensure_error_buffer",
    "set_debug",
]
