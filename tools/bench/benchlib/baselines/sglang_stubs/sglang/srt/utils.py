"""verify_attn bench stand-in for `sglang.srt.utils` (only what the staged kernels import)."""

import functools

import torch


@functools.lru_cache(maxsize=None)
def is_cuda() -> bool:
    return bool(torch.cuda.is_available() and torch.version.cuda is not None)


@functools.lru_cache(maxsize=None)
def is_hip() -> bool:
    return getattr(torch.version, "hip", None) is not None


def _gfx_arch() -> str:
    if not is_hip():
        return ""
    try:
        return str(torch.cuda.get_device_properties(0).gcnArchName)
    except Exception:  # pragma: no cover
        return ""


def is_gfx95_supported() -> bool:
    return _gfx_arch().startswith("gfx95")


def is_gfx1250_supported() -> bool:
    return _gfx_arch().startswith("gfx1250")


def get_device_core_count(device_id: int = 0) -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return 0


def is_musa() -> bool:
    return False


def get_device_capability(device_id: int = 0):
    if torch.cuda.is_available():
        return torch.cuda.get_device_capability(device_id)
    return (None, None)
