"""FlashInfer's custom-mask paged prefill (GQA), when FlashInfer is importable.

**Not stageable on the lent H200 (decision, checked on the dev machine):**
``flashinfer-python`` 0.7.2.post1 (the current release) is a 62 MB
``py3-none-any`` wheel (its ``data/csrc`` alone is 262 MB unpacked) that holds
CUDA *sources*: the custom-mask prefill kernel is JIT-compiled with nvcc and
ninja at first use. The GPU machine has no network, and the carry to it is
64 MiB in all (shared with our wheel and the SGLang files), so the wheel alone
does not fit; its required dependencies (``apache-tvm-ffi``,
``nvidia-cutlass-dsl``, ``cuda-python``, ``cuda-tile``, ``nccl4py``,
``nvidia-cudnn-frontend``, ``ninja``, ...) are not installed there either; and
the JIT compile of the prefill module would be redone on every fresh machine
(minutes, out of a 10-minute command). The prebuilt ``flashinfer-cubin`` /
``flashinfer-jit-cache`` wheels are larger still. Pruning the package down to
the FA2 prefill sources and its import graph is possible in principle but is a
fork of FlashInfer we could not test here. So the column reports "not
available: flashinfer not importable" unless a machine has FlashInfer
installed, in which case this adapter runs it:

``BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD").plan(qo_indptr,
kv_indptr (pages), kv_indices, last_page_len, H, Hkv, D, page_size,
custom_mask=<q_len x kv_len bools per request, row-major>, q_data_type,
kv_data_type, sm_scale)`` then ``run(q, (k_cache, v_cache))`` with caches
``[pages, page_size, Hkv, D]``. The custom mask covers the whole ``q_len x
kv_len`` rectangle (drafts included), the same layout as SGLang's FULL mask;
FlashInfer bit-packs it and tests it on every KV tile (DESIGN.md §2).
MLA is out of scope: FlashInfer's MLA wrappers take no custom mask.
"""

from typing import Optional

import torch

from . import Impl, NotApplicable

NOT_STAGEABLE = ("not stageable on the GPU machine: flashinfer-python is a 62 MB source wheel "
                 "JIT-compiled with nvcc, over the 64 MiB carry with its deps (see baselines/flashinfer.py)")


def _import():
    import flashinfer  # noqa: PLC0415

    return flashinfer


class FlashInferPrefill(Impl):
    name = "flashinfer"
    label = "FlashInfer prefill (custom mask)"

    def __init__(self):
        self._fi = None
        self._why = None

    def unavailable(self) -> Optional[str]:
        if not torch.cuda.is_available():
            return "needs CUDA"
        if self._fi is None and self._why is None:
            try:
                self._fi = _import()
            except Exception as e:  # noqa: BLE001
                self._why = f"{NOT_STAGEABLE}; import: {type(e).__name__}"
        return self._why

    def applies(self, case):
        if case.shape.mla:
            return "MLA: FlashInfer's MLA wrappers take no custom mask"
        return None

    def prepare(self, case, inputs):
        fi = self._fi
        s = case.shape
        ps = case.page_size
        if s.mla:
            raise NotApplicable(self.applies(case))
        k4 = inputs.k_cache if inputs.k_cache.dim() == 4 else inputs.k_cache.unsqueeze(1)
        v4 = inputs.v_cache if inputs.v_cache.dim() == 4 else inputs.v_cache.unsqueeze(1)
        mask, _ = case.full_mask()
        last = ((case.kv_len.to(torch.int64) - 1) % ps + 1).to(torch.int32)
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=case.device)
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(case.qo_indptr, case.kv_indptr_pages, case.kv_indices, last,
               s.heads, s.kv_heads, s.d_qk, ps, custom_mask=mask,
               q_data_type=case.dtype, kv_data_type=case.dtype, sm_scale=case.sm_scale)
        out = torch.empty((case.total_q, s.heads, s.d_vo), dtype=case.dtype, device=case.device)
        q = inputs.q

        def run():
            try:
                return w.run(q, (k4, v4), out=out)
            except TypeError:
                return w.run(q, (k4, v4))

        return run
