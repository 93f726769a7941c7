"""Build and runtime facts, and the toolchain smoke kernel."""

from . import _ext
from ._version import __version__


def runtime_info():
    """Describe the installed build and the CUDA runtime it carries.

    Returns:
      dict with keys
        ``version`` (str): the package version,
        ``abi_version`` (int): the C-ABI version (``VA_ABI_VERSION``),
        ``cuda_runtime`` (int): CUDA runtime linked in, e.g. 13000 for 13.0,
        ``cuda_driver`` (int): the driver's CUDA version, 0 when no driver,
        ``compiled_archs`` (list[str]): GPU archs of the fat binary,
          e.g. ``["sm_90a", "sm_120a"]``,
        ``config_tags`` (list[str]): every kernel configuration's tag, in
          the plan's order (``va_config_tags``): the names
          ``VERIFY_ATTN_FORCE_CONFIG`` and ``bench --compare_configs`` take.

    Raises:
      ImportError: the compiled extension is not available.
    """
    C = _ext.load()
    runtime, driver = C.cuda_versions()
    return {
        "version": __version__,
        "abi_version": C.abi_version(),
        "cuda_runtime": runtime,
        "cuda_driver": driver,
        "compiled_archs": C.compiled_archs().split(","),
        "config_tags": C.config_tags().split(","),
    }


def scaled_copy(x, scale):
    """Toolchain smoke kernel: return ``scale * x`` computed by a CUDA kernel.

    Args:
      x: CUDA tensor, dtype torch.float16 or torch.bfloat16, any shape,
        contiguous.
      scale (float): multiplier.

    Returns:
      A new tensor like ``x``.

    Raises:
      TypeError: ``x`` is not a tensor or not fp16/bf16.
      ValueError: ``x`` is not a contiguous CUDA tensor.
      RuntimeError: no CUDA device, or the launch failed.
    """
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError("x: expected a torch.Tensor, got %s" % type(x).__name__)
    dtypes = {torch.float16: "DTYPE_FP16", torch.bfloat16: "DTYPE_BF16"}
    if x.dtype not in dtypes:
        raise TypeError("x: dtype must be torch.float16 or torch.bfloat16, got %s" % x.dtype)
    if not x.is_contiguous():
        raise ValueError("x: must be contiguous")
    if x.device.type != "cuda":
        raise ValueError("x: must be a CUDA tensor, got device %s" % x.device)
    C = _ext.load()
    y = torch.empty_like(x)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    with torch.cuda.device(x.device):
        C.scaled_copy(x.data_ptr(), y.data_ptr(), x.numel(), float(scale),
                      getattr(C, dtypes[x.dtype]), stream)
    return y
