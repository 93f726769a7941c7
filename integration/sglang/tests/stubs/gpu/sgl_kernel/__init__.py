"""Stand-in for ``sgl_kernel`` (package ``sglang-kernel``; NOT its code).

On CUDA, SGLang 0.5.23 imports ``sgl_kernel`` at module level in many places
(quantization schemes, ``triton_backend``'s ``is_arch_support_pdl``), but the
attention paths the tests run (Triton backend, verify_attn backend, the
attention test kit) call none of its kernels. ``sglang-kernel`` 0.4.10 is a
several-hundred-MB wheel that cannot be staged under the 64 MiB carry limit, so
the GPU tests put this stand-in on ``sys.path``: imports succeed, any call
raises. ``utils.is_arch_support_pdl`` returns False (no programmatic dependent
launch: only a scheduling hint for the Triton kernels).
"""

from _va_stub import install


def _is_arch_support_pdl():
    return False


install(globals(), {"sgl_kernel.utils.is_arch_support_pdl": _is_arch_support_pdl})
