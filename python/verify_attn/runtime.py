"""Build and runtime facts (the toolchain smoke kernel: ``verify_attn.testing.scaled_copy``)."""

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
          ``Tuning(config=...)`` and ``bench --compare_configs`` take.

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
