"""verify_attn bench stand-in for `sglang.srt.environ` (only `envs.<NAME>.get()`).

Defaults are SGLang 0.5.23's for the switches the staged attention kernels read;
a variable set in the process environment overrides them, as in SGLang.
"""

import os

_DEFAULTS = {
    "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS": False,
    "SGLANG_FORCE_LEAN_GRID_CU_MULT": 1.0,
    "SGLANG_TRITON_COMPACT_EXTEND_ATTENTION": True,
    "SGLANG_MLA_DECODE_TUNE": False,
    "SGLANG_TRITON_FP8_PREFILL_ATTN": True,
}


class _Env:
    def __init__(self, name, default):
        self.name = name
        self.default = default

    def get(self):
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        if isinstance(self.default, bool):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(self.default, float):
            return float(raw)
        if isinstance(self.default, int):
            return int(raw)
        return raw

    def is_set(self):
        return self.name in os.environ


class _Envs:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Env(name, _DEFAULTS.get(name, None))


envs = _Envs()


def redirect_third_party_caches():  # imported by sglang/__init__.py (not staged)
    return None
