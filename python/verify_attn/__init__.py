"""verify_attn (smoke build)."""
from ._version import __version__
from .runtime import runtime_info, scaled_copy
