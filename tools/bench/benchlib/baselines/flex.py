"""PyTorch FlexAttention: what a PyTorch user would reach for.

``torch.compile``d ``torch.nn.attention.flex_attention.flex_attention`` with a
tree ``mask_mod`` and a ``BlockMask`` from ``create_block_mask``, on the flat
layout (every request's prefix and drafts packed into one sequence, the
"document masking" pattern; FlexAttention has no paged gather of its own):

- ``q``: ``[1, H, total_q, Dqk]``; ``k``: ``[1, Hkv, total_kv, Dqk]``;
  ``v``: ``[1, Hkv, total_kv, Dvo]``; ``enable_gqa`` when ``H != Hkv``;
- MLA: H query heads over one KV head, ``Dqk = 576``, ``Dv = 512`` (``v`` is a
  contiguous copy of the first 512 columns of ``k``); expected to fail to
  compile on the H200 with torch 2.11, which the row reports;
- ``mask_mod(b, h, q_idx, kv_idx)``: same request, and either a prefix column
  or a draft column whose bit is set in the compact tree mask; a closure over
  ``q_req`` (request of each query row), ``kv_req``/``kv_col`` (request and
  draft column of each KV row, -1 for the prefix) and the tree mask words.

Building the block mask (``_compile=True``) and the layout copies is setup,
not timed (like our plan step). ``torch._dynamo``'s recompile limit is raised
so that every shape compiles its own kernel instead of silently falling back
to the unfused eager path. On CPU (tests) the same adapter runs eagerly.
"""

from typing import Optional

import torch

from . import Impl, short_reason

_COMPILED = {}


def _flex_api():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415

    return flex_attention, create_block_mask


def _raise_recompile_limits():
    cfg = torch._dynamo.config
    for name, value in (("recompile_limit", 4096), ("cache_size_limit", 4096),
                        ("accumulated_recompile_limit", 1 << 16),
                        ("accumulated_cache_size_limit", 1 << 16)):
        if hasattr(cfg, name):
            try:
                setattr(cfg, name, value)
            except Exception:  # noqa: BLE001
                pass


def compiled_flex():
    if "flex" not in _COMPILED:
        flex_attention, _ = _flex_api()
        _raise_recompile_limits()
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def tree_mask_mod(q_req, kv_req, kv_col, words):
    """The tree ``mask_mod``: a closure over device tensors (no Python branching)."""
    max_col = words.shape[1] * 32 - 1

    def mask_mod(b, h, q_idx, kv_idx):
        same = kv_req[kv_idx] == q_req[q_idx]
        col = kv_col[kv_idx]
        cc = torch.clamp(col, 0, max_col)
        w = words[q_idx, cc // 32]
        bit = (w >> (cc % 32)) & 1
        return same & ((col < 0) | (bit != 0))

    return mask_mod


def layout_tensors(case):
    """``q_req [total_q]``, ``kv_req [total_kv]``, ``kv_col [total_kv]`` (int32)."""
    dev = case.device
    q_req = torch.repeat_interleave(
        torch.arange(case.batch, dtype=torch.int32, device=dev),
        torch.tensor(case.q_lens, dtype=torch.int64, device=dev))
    kv_req = torch.repeat_interleave(
        torch.arange(case.batch, dtype=torch.int32, device=dev),
        torch.tensor(case.kv_lens, dtype=torch.int64, device=dev))
    starts = case.kv_indptr_flat.to(torch.int64)[:-1]
    pos = torch.arange(case.total_kv, dtype=torch.int64, device=dev) - starts[kv_req.long()]
    pre = case.prefix_lens_t.to(torch.int64)[kv_req.long()]
    kv_col = torch.where(pos < pre, torch.full_like(pos, -1), pos - pre).to(torch.int32)
    return q_req.contiguous(), kv_req.contiguous(), kv_col.contiguous()


class Flex(Impl):
    name = "flex"
    label = "FlexAttention (torch.compile)"

    def __init__(self, compile: bool = True):
        self.compile = compile
        self._bm = (None, None)   # (case, BlockMask): one block mask per case, shared by its input sets

    def release(self) -> None:
        self._bm = (None, None)

    def unavailable(self) -> Optional[str]:
        try:
            _flex_api()
        except Exception as e:  # noqa: BLE001
            return f"torch.nn.attention.flex_attention unavailable: {type(e).__name__}: {e}"
        return None

    def prepare(self, case, inputs):
        flex_attention, create_block_mask = _flex_api()
        s = case.shape
        on_cuda = case.device.type == "cuda"
        if self._bm[0] is case:
            bm = self._bm[1]
        else:
            self._bm = (None, None)
            q_req, kv_req, kv_col = layout_tensors(case)
            words = case.tree_mask.contiguous()
            mask_mod = tree_mask_mod(q_req, kv_req, kv_col, words)
            try:
                bm = create_block_mask(mask_mod, None, None, case.total_q, case.total_kv,
                                       device=case.device, _compile=bool(on_cuda and self.compile))
            except Exception as e:  # noqa: BLE001
                raise RuntimeError(f"create_block_mask failed: {short_reason(e)}") from e
            self._bm = (case, bm)
        q4 = inputs.q.transpose(0, 1).unsqueeze(0).contiguous()        # [1, H, Tq, Dqk]
        k4 = inputs.k_flat.transpose(0, 1).unsqueeze(0).contiguous()   # [1, Hkv, Tkv, Dqk]
        if inputs.v_flat is None:
            v4 = inputs.k_flat[..., : s.d_vo].transpose(0, 1).unsqueeze(0).contiguous()
        else:
            v4 = inputs.v_flat.transpose(0, 1).unsqueeze(0).contiguous()
        fn = compiled_flex() if (self.compile and on_cuda) else flex_attention
        gqa = s.heads != s.kv_heads
        scale = case.sm_scale

        def run():
            o = fn(q4, k4, v4, block_mask=bm, scale=scale, enable_gqa=gqa)
            return o[0].transpose(0, 1)   # [total_q, H, Dvo] (a view)

        try:  # the first call compiles: report its failure as a compile failure
            run()
            if on_cuda:
                torch.cuda.synchronize(case.device)
        except Exception as e:  # noqa: BLE001
            what = "compile failed" if (self.compile and on_cuda) else "failed"
            raise RuntimeError(f"{what}: {short_reason(e)}") from e
        return run
