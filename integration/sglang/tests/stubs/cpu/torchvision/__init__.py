"""CPU-test stand-in for torchvision (NOT torchvision; verify_attn's own code).

SGLang 0.5.23 imports ``torchvision.transforms`` at module level from its
multimodal helpers (``sglang/srt/multimodal/internvl_utils.py``, reached from
``sglang.srt.configs``, which ``triton_backend`` imports). PyPI's torchvision
0.28.0, the release matching the CI venv's torch 2.13.0, is built against CUDA
torch: with the CPU torch its ``_C`` does not load and ``import torchvision``
fails (``operator torchvision::nms does not exist``). Nothing the CPU tests run
uses torchvision. The GPU machine has the real torchvision and never sees this.
"""

from _va_stub import install

install(globals())
