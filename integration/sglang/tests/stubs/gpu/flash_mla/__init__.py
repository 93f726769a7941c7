"""Stand-in for ``flash_mla`` (package ``sgl-flash-mla``; NOT its code).

SGLang 0.5.23's EAGLE worker imports ``FlashMLABackend`` while it captures the
draft's CUDA graphs, whatever the attention backend (only to test the draft
backend's class), and that module imports ``flash_mla`` at module level. The
Engine check and the GPU tests never call FlashMLA, so this stand-in lets the
import succeed: any call raises.
"""

from _va_stub import install

install(globals(), {})
