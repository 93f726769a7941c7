"""This project's kernels as benchmark implementations.

- flat: :func:`verify_attn.tree_attention_flat` over the request-contiguous KV;
- paged: :func:`verify_attn.tree_attention_paged` over the scattered paged
  cache (page size 1 like SGLang's token pool, or ``--page_size``).

Both get the compact tree mask (chains too: the tree path is what an engine
calls), the host bounds ``max_q_len``/``max_kv_len`` (no host sync, so the
call can be captured in a CUDA graph) and a preallocated ``out``. Each is timed
eagerly and as a CUDA-graph replay. The paged kernel under graph replay is the
product configuration: the speedups are quoted for it.
"""

from .baselines import Impl


def _splits_kw(num_splits):
    """The API's num_splits argument for a forced split-K count; none for 0 (the plan's)."""
    return {"num_splits": num_splits} if num_splits else {}


class OursFlat(Impl):
    """The flat kernel; ``num_splits``: the API's forced split-K count (0: the plan's)."""

    name = "ours_flat"
    label = "verify_attn flat"
    competitor = False
    check_vs_ours = False

    def __init__(self, num_splits=0):
        self.num_splits = num_splits

    def prepare(self, case, inputs):
        import torch
        import verify_attn as va

        s = case.shape
        out = torch.empty((case.total_q, s.heads, s.d_vo), dtype=case.dtype, device=case.device)
        kw = dict(tree_mask=case.tree_mask, sm_scale=case.sm_scale, head_dim_vo=s.d_vo,
                  max_q_len=case.max_q_len, max_kv_len=case.max_kv_len, out=out,
                  **_splits_kw(self.num_splits))
        q, k, v = inputs.q, inputs.k_flat, inputs.v_flat
        qo, kvp = case.qo_indptr, case.kv_indptr_flat

        def run():
            va.tree_attention_flat(q, k, v, qo, kvp, **kw)
            return out

        return run


class OursPaged(Impl):
    """The paged kernel; with ``force_config`` (a ``VERIFY_ATTN_FORCE_CONFIG`` tag) the
    same call with that configuration forced, set around each call (the plan reads
    the variable at every call; a CUDA graph keeps what its capture planned), as
    the column ``ours_paged@<tag>``: an A/B of two kernel variants in one process,
    without the run-to-run drift of separate runs. A variant is also checked
    against the default configuration's output. ``num_splits``: the API's forced
    split-K count (0: the plan's)."""

    name = "ours_paged"
    label = "verify_attn paged"
    competitor = False
    check_vs_ours = False

    def __init__(self, force_config=None, num_splits=0):
        self.force_config = force_config
        self.num_splits = num_splits
        if force_config:
            self.name = f"ours_paged@{force_config}"
            self.label = f"verify_attn paged @{force_config}"
            self.check_vs_ours = True

    def _forced(self, fn):
        """fn run with VERIFY_ATTN_FORCE_CONFIG = force_config (restored after)."""
        import os

        if not self.force_config:
            return fn()
        key = "VERIFY_ATTN_FORCE_CONFIG"
        old = os.environ.get(key)
        os.environ[key] = self.force_config
        try:
            return fn()
        finally:
            if old is None:
                del os.environ[key]
            else:
                os.environ[key] = old

    def prepare(self, case, inputs):
        import torch
        import verify_attn as va

        s = case.shape
        out = torch.empty((case.total_q, s.heads, s.d_vo), dtype=case.dtype, device=case.device)
        kw = dict(page_size=case.page_size, tree_mask=case.tree_mask, sm_scale=case.sm_scale,
                  head_dim_vo=s.d_vo, max_q_len=case.max_q_len, max_kv_len=case.max_kv_len, out=out)
        if case.kv_slot_runs > 1:  # (older wheels have no such argument)
            kw["kv_slot_runs"] = case.kv_slot_runs
        kw.update(_splits_kw(self.num_splits))
        q, kc, vc = inputs.q, inputs.k_cache, inputs.v_cache
        args = (case.qo_indptr, case.kv_indptr_pages, case.kv_indices, case.kv_len)

        def run():
            self._forced(lambda: va.tree_attention_paged(q, kc, vc, *args, **kw))
            return out

        return run

    def plan(self, case, inputs):
        """``verify_attn.plan_info`` for the row (kernel config name, splits)."""
        import verify_attn as va

        s = case.shape
        extra = {"kv_slot_runs": case.kv_slot_runs} if case.kv_slot_runs > 1 else {}
        extra.update(_splits_kw(self.num_splits))
        return self._forced(lambda: va.plan_info(
            inputs.q, inputs.k_cache, inputs.v_cache, case.qo_indptr, case.kv_indptr_pages,
            case.kv_indices, case.kv_len, page_size=case.page_size, tree_mask=case.tree_mask,
            sm_scale=case.sm_scale, head_dim_vo=s.d_vo, max_q_len=case.max_q_len,
            max_kv_len=case.max_kv_len, **extra))
