"""torch's FlashAttention-2 (``scaled_dot_product_attention``, FLASH backend) on the dense problem.

The GQA anchor of the portable kernels: FlashAttention-2 as torch ships it,
on the same batch, heads, head dim, draft and prefix lengths as the row but
*dense and unmasked* (every draft sees every row, no tree) over a *flat*
KV (``[B, Hkv, prefix + q_len, D]``, each request contiguous): the most a
fused attention kernel gets from the shape. Ours masks a tree and reads a
paged cache, so ``xFA2-dense`` above 1x means our tree verify beats FA2 on an
easier problem of the same size. Checked against the float64 reference of the
unmasked problem (``computes = "dense"``), never against our output.

The timed call returns FA2's output as ``[total_q, H, D]``: a view of torch's
FLASH output (stored token-major), a copy if torch ever stored it otherwise.

Rows it does not serve: MLA (576/512 head dims: FlashAttention-2 takes equal
head dims up to 256), ragged batches (one q_len and one prefix for every request).
"""

from typing import Optional

from . import Impl


class SdpaFlashDense(Impl):
    name = "sdpa_flash"
    label = "torch SDPA flash (FlashAttention-2), dense unmasked, flat KV"
    computes = "dense"
    check_vs_ours = False
    na_before_unavailable = True

    def __init__(self, backends=None):
        # torch.nn.attention.SDPBackend members to allow (None: FLASH_ATTENTION only;
        # the CPU tests pass MATH)
        self.backends = backends

    def unavailable(self) -> Optional[str]:
        import torch

        if self.backends is None and not torch.cuda.is_available():
            return "needs CUDA"
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except ImportError as e:
            return f"torch has no sdpa_kernel ({e})"
        return None

    def applies(self, case) -> Optional[str]:
        s = case.shape
        if s.mla or s.d_qk != s.d_vo or s.d_qk > 256:
            return f"head dims {s.d_qk}/{s.d_vo} (FlashAttention-2: equal head dims <= 256)"
        if len(set(case.q_lens)) > 1 or len(set(case.kv_lens)) > 1:
            return "ragged batch (one q_len and one prefix for every request)"
        if self.backends is None and not str(case.device).startswith("cuda"):
            return "needs CUDA"
        return None

    def prepare(self, case, inputs):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        s = case.shape
        B, T, L = case.batch, case.q_lens[0], case.kv_lens[0]
        q = inputs.q.view(B, T, s.heads, s.d_qk).transpose(1, 2)          # [B, H, T, D]
        k = inputs.k_flat.view(B, L, s.kv_heads, s.d_qk).transpose(1, 2)  # [B, Hkv, L, D]
        v = inputs.v_flat.view(B, L, s.kv_heads, s.d_vo).transpose(1, 2)
        scale = case.sm_scale
        backends = list(self.backends) if self.backends is not None else [SDPBackend.FLASH_ATTENTION]

        def run():
            with sdpa_kernel(backends):
                o = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
            return o.transpose(1, 2).reshape(case.total_q, s.heads, s.d_vo)

        return run
