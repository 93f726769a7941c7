"""The PyTorch reference as an implementation (``--dry_run`` only).

On a GPU run the float64 reference is the correctness check (see
:mod:`benchlib.check`), never a competitor. ``--dry_run`` (CPU, CI) times
:func:`verify_attn.reference.reference_attention_flat` in float32 so that the
whole pipeline (inputs, check, timing, floor, report) runs without a GPU.
"""

import torch

from verify_attn.reference import reference_attention_flat

from . import Impl


class TorchReference(Impl):
    name = "torch_ref"
    label = "PyTorch reference (fp32)"
    competitor = False
    graphable = False
    check_vs_ours = False

    def prepare(self, case, inputs):
        s = case.shape

        def run():
            out, _ = reference_attention_flat(
                inputs.q, inputs.k_flat, inputs.v_flat, case.qo_indptr, case.kv_indptr_flat,
                tree_mask=case.tree_mask, sm_scale=case.sm_scale, head_dim_vo=s.d_vo,
                compute_dtype=torch.float32)
            return out

        return run
