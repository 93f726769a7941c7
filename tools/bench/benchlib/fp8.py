"""fp8 (e4m3) copies of a row's caches for the ``--kv_dtype=fp8_e4m3`` columns.

Each cache is divided by its per-tensor scale ``amax / 448`` (e4m3's largest
finite value, OCP FP8 E4M3) and rounded to ``torch.float8_e4m3fn``, the layout a
serving engine's fp8 pool holds (SGLang stores ``K / k_scale``). MLA has one
cache (the values are its first columns) and one scale. Every column that runs
on fp8 caches takes its copies from one :class:`Fp8Caches`, so all compare on
the same bytes.
"""

import torch

from .timing import MAX_SETS

E4M3_MAX = 448.0


def quantize(t: torch.Tensor):
    """``(t / scale as float8_e4m3fn, scale)`` with ``scale = amax(|t|) / 448``."""
    scale = max(float(t.abs().max()), 1e-30) / E4M3_MAX
    return (t.float() / scale).to(torch.float8_e4m3fn), scale


class Fp8Caches:
    """The fp8 copies of the caches of the last ``keep`` input sets, made once each
    (``keep``: every set a row rotates over, so each column of the row reuses them):
    ``get(inputs) -> (k8, k_scale, v8, v_scale)``, ``v8`` and ``v_scale`` None for
    MLA (``inputs.v_cache`` None)."""

    def __init__(self, keep: int = MAX_SETS):
        self.keep = keep
        self._made = []  # (inputs, copies): the inputs held, so an id is never reused

    def get(self, inputs):
        made = next((m for src, m in self._made if src is inputs), None)
        if made is None:
            k8, ks = quantize(inputs.k_cache)
            v8, vs = (None, None) if inputs.v_cache is None else quantize(inputs.v_cache)
            made = (k8, ks, v8, vs)
            self._made = (self._made + [(inputs, made)])[-self.keep:]
        return made


SHARED = Fp8Caches()
