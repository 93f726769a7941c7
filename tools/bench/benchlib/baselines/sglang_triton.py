"""SGLang 0.5.23's Triton verify kernels, loaded from the staged wheel files.

What SGLang runs today (read from the wheel, ``sglang/srt/layers/attention/
triton_backend.py``, target verify):

- tree (speculative top-k > 1): ``sglang/kernels/ops/attention/
  extend_attention.py::extend_attention_fwd(q_extend, k_extend, v_extend,
  o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
  is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale=None, ...,
  page_size=1, ...)`` with ``qo_indptr = arange(0, (bs+1)*N, N)`` (int32),
  ``kv_indptr``/``kv_indices`` over the committed prefix only (token slots,
  int64 indices), the draft K/V passed contiguously as ``k_extend``/
  ``v_extend`` (``k.contiguous()``, ``v.contiguous()``), the FULL bool
  ``custom_mask`` of ``q_len * (prefix + q_len)`` per request with an int64
  ``mask_indptr``, ``max_len_extend = N``, ``k_scale = v_scale = 1.0`` (no FP8
  KV), ``skip_prefix_custom_mask=True`` (default). MLA: ``k_buffer`` is the
  ``[slots, 1, 576]`` latent cache and ``v_buffer`` its ``[..., :512]`` view.
- chain (top-k == 1; ``use_verify_shared_kv``):
  ``sglang/kernels/ops/attention/verify_mla.py::verify_shared_kv_fwd`` with
  the same arguments (plus ``max_bs``); it returns False when its
  ``can_handle`` refuses the problem (then SGLang falls back to the extend
  kernel; here the column says "n/a"). It reads no mask: causal only.

Loading: the files are staged by ``tools/bench/fetch_baselines.sh`` into
``<baselines_dir>/sglang/kernels/ops/attention/``; the two server modules they
import (``sglang.srt.utils``, ``sglang.srt.environ``) come from our stand-ins
in ``sglang_stubs/``. :func:`load` builds the ``sglang`` package object with
both folders on its ``__path__`` (so no SGLang ``__init__`` runs).
"""

import importlib
import os
import sys
import types
from typing import Optional

import torch

from . import Impl, NotApplicable

STUBS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_stubs")
_ATTN = ("sglang", "kernels", "ops", "attention")
NOT_STAGED = "not staged (run tools/bench/fetch_baselines.sh)"

_LOADED = {}


class NotStaged(Exception):
    pass


def staged_file(baselines_dir: str, name: str) -> str:
    return os.path.join(baselines_dir, *_ATTN, name)


def load(baselines_dir: str):
    """Import the staged ``extend_attention`` and ``verify_mla`` modules.

    Returns ``(extend_attention_module, verify_mla_module_or_None, error_or_None)``.
    Raises :class:`NotStaged` when the files are absent.
    """
    key = os.path.abspath(baselines_dir)
    if key in _LOADED:
        return _LOADED[key]
    if not os.path.isfile(staged_file(baselines_dir, "extend_attention.py")):
        raise NotStaged(f"{NOT_STAGED}: no {staged_file(baselines_dir, 'extend_attention.py')}")
    roots = [os.path.join(key, "sglang"), os.path.join(STUBS_DIR, "sglang")]
    pkg = sys.modules.get("sglang")
    if pkg is None or getattr(pkg, "__verify_attn_bench__", False) is False:
        pkg = types.ModuleType("sglang")
        pkg.__path__ = roots
        pkg.__verify_attn_bench__ = True
        pkg.__doc__ = "verify_attn bench: staged SGLang kernels + our stand-ins (no SGLang __init__)"
        sys.modules["sglang"] = pkg
        for name in ("sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
                     "sglang.srt"):
            sys.modules.pop(name, None)
    # sglang.kernels(.ops.attention) resolve through pkg.__path__ (the marker
    # __init__ files written by fetch_baselines.sh, or namespace packages).
    ext = importlib.import_module("sglang.kernels.ops.attention.extend_attention")
    if not os.path.abspath(ext.__file__).startswith(key):
        raise NotStaged(f"sglang.kernels.ops.attention.extend_attention came from {ext.__file__}, "
                        f"not from {key}")
    vmla, verr = None, None
    try:
        vmla = importlib.import_module("sglang.kernels.ops.attention.verify_mla")
    except Exception as e:  # noqa: BLE001 - reported in the chain column
        verr = f"{type(e).__name__}: {e}"
    _LOADED[key] = (ext, vmla, verr)
    return _LOADED[key]


def _common(case, inputs):
    s = case.shape
    mask, mask_indptr = case.full_mask()
    out = torch.empty((case.total_q, s.heads, s.d_vo), dtype=case.dtype, device=case.device)
    return mask, mask_indptr, out


class _SGLangBase(Impl):
    def __init__(self, baselines_dir: str):
        self.baselines_dir = baselines_dir
        self._err = None
        self._mods = None

    def _modules(self):
        if self._mods is None and self._err is None:
            try:
                self._mods = load(self.baselines_dir)
            except NotStaged as e:
                self._err = str(e) if str(e).startswith(NOT_STAGED) else f"{NOT_STAGED}: {e}"
            except Exception as e:  # noqa: BLE001
                self._err = f"import failed: {type(e).__name__}: {e}"
        return self._mods

    def unavailable(self) -> Optional[str]:
        if not torch.cuda.is_available():
            return "needs CUDA (Triton)"
        self._modules()
        if self._err:
            return self._err.split(":")[0] if self._err.startswith(NOT_STAGED) else self._err
        return None


class SGLangExtend(_SGLangBase):
    """``extend_attention_fwd`` with the FULL tree mask (SGLang's tree-verify path)."""

    name = "sglang_extend"
    label = "SGLang extend (FULL mask)"

    def prepare(self, case, inputs):
        ext, _, _ = self._modules()
        mask, mask_indptr, out = _common(case, inputs)
        fn = ext.extend_attention_fwd
        args = (
            inputs.q, inputs.k_ext, inputs.v_ext, out,
            inputs.k_slots, inputs.v_slots,
            case.qo_indptr, case.prefix_indptr, case.prefix_slots,
            mask, False, mask_indptr, case.max_q_len, 1.0, 1.0,
        )
        kw = dict(sm_scale=case.sm_scale)

        def run():
            fn(*args, **kw)
            return out

        return run


class SGLangExtendFp8(SGLangExtend):
    """``extend_attention_fwd`` on the fp8 (e4m3) copies of the row's caches
    (:mod:`benchlib.fp8`, the bytes ``ours_paged@fp8`` reads) with their scales, as
    SGLang's Triton backend runs target verify on an fp8 pool: the prefix from the
    fp8 ``k_buffer`` / ``v_buffer``, the drafts' K / V passed in q's dtype
    (``k_extend`` / ``v_extend``), ``k_scale`` / ``v_scale`` the layer's floats (MLA:
    ``v_buffer`` the latent cache's first 512 columns, ``k_scale`` for both). The
    kernel casts q to the cache's dtype for the prefix products (``q.to(k.dtype)``,
    extend_attention.py), so its error against the q-dtype cache's float64 result
    carries q's fp8 rounding too: its own bound (``tol``)."""

    name = "sglang_extend@fp8"
    label = "SGLang extend (FULL mask), fp8 cache"
    tol = 1e-1

    def prepare(self, case, inputs):
        from .. import fp8

        ext, _, _ = self._modules()
        mask, mask_indptr, out = _common(case, inputs)
        s = case.shape
        k8, ks, v8, vs = fp8.SHARED.get(inputs)
        k8_slots = k8.view(case.num_slots, s.kv_heads, s.d_qk)
        v8_slots = k8_slots[..., : s.d_vo] if v8 is None else v8.view(case.num_slots, s.kv_heads, s.d_vo)
        fn = ext.extend_attention_fwd
        args = (
            inputs.q, inputs.k_ext, inputs.v_ext, out,
            k8_slots, v8_slots,
            case.qo_indptr, case.prefix_indptr, case.prefix_slots,
            mask, False, mask_indptr, case.max_q_len, ks, ks if vs is None else vs,
        )
        kw = dict(sm_scale=case.sm_scale)

        def run():
            fn(*args, **kw)
            return out

        return run


class SGLangChain(_SGLangBase):
    """``verify_shared_kv_fwd`` (chains only: top-k == 1; causal, no mask read)."""

    name = "sglang_chain"
    label = "SGLang verify_shared_kv (chain)"

    def applies(self, case):
        if not case.shape.is_chain:
            return "chain-only kernel (top-k 1); this shape is a tree"
        if not case.uniform_q:
            return "needs one q_len for every request"
        return None

    def unavailable(self):
        r = super().unavailable()
        if r:
            return r
        _, vmla, verr = self._mods
        if vmla is None:
            return f"verify_mla import failed: {verr}"
        return None

    def prepare(self, case, inputs):
        _, vmla, _ = self._modules()
        s = case.shape
        out = torch.empty((case.total_q, s.heads, s.d_vo), dtype=case.dtype, device=case.device)
        fn = vmla.verify_shared_kv_fwd
        args = (
            inputs.q, inputs.k_ext, inputs.v_ext, out,
            inputs.k_slots, inputs.v_slots,
            case.qo_indptr, case.prefix_indptr, case.prefix_slots,
            None, True, None, case.max_q_len, 1.0, 1.0,
        )
        kw = dict(sm_scale=case.sm_scale, max_bs=case.batch)
        ran = fn(*args, **kw)
        if ran is False:
            raise NotApplicable("verify_shared_kv_fwd refused it (can_handle() is False)")

        def run():
            fn(*args, **kw)
            return out

        return run
