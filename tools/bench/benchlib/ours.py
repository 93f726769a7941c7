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

# Shared memory per block on sm_120 (RTX PRO 6000 Blackwell): the cap under which
# the plan picks sm_120's configurations (bench --sm120).
SM120_SMEM_BYTES = 101376


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
    """The paged kernel as a model calls it: a :class:`verify_attn.TreeAttentionPlan`
    made once per row (the batch), :meth:`run` per call (a layer), timed eagerly and
    as a CUDA-graph replay. With ``force_config`` (a configuration tag) the same
    plan with ``Tuning(config=force_config)``, as the column
    ``ours_paged@<tag>``: an A/B of two kernel variants in one process, without
    the run-to-run drift of separate runs; a variant is also checked against the
    default configuration's output. ``num_splits``: the plan's forced split-K
    count (0: the plan's choice). ``max_smem_bytes`` (with ``tag``, e.g.
    ``sm120`` and 101376): the plan made as for a card with that much shared
    memory per block, i.e. the configuration sm_120 runs, on this card.
    ``balance_splits`` (with ``tag``): True, the batch's split CTAs shared by
    KV length wherever the kernel can; False, every request split
    ``num_splits`` ways (``Tuning(balance_splits=...)``). ``pair_splits``
    (with ``tag``): False, two splits write partial rows for the merge kernel
    instead of combining in a cluster (``Tuning(pair_splits=...)``)."""

    name = "ours_paged"
    label = "verify_attn paged"
    competitor = False
    check_vs_ours = False

    def __init__(self, force_config=None, num_splits=0, max_smem_bytes=0, tag=None, balance_splits=None,
                 pair_splits=None):
        self.force_config = force_config
        self.num_splits = num_splits
        self.max_smem_bytes = max_smem_bytes
        self.balance_splits = balance_splits
        self.pair_splits = pair_splits
        tag = tag or force_config
        if tag:
            self.name = f"ours_paged@{tag}"
            self.label = f"verify_attn paged @{tag}"
            self.check_vs_ours = True

    def tuning(self):
        """The :class:`verify_attn.Tuning` of this column (None: the plan's rules)."""
        import verify_attn as va

        if not self.force_config and not self.max_smem_bytes and self.balance_splits is None and \
                self.pair_splits is None:
            return None
        return va.Tuning(config=self.force_config or "", max_smem_bytes=self.max_smem_bytes,
                         balance_splits=self.balance_splits, pair_splits=self.pair_splits)

    def _caches(self, inputs):
        """The caches this column runs on and the plan's keywords for them."""
        return inputs.k_cache, inputs.v_cache, {}

    def _plan(self, case, inputs):
        import verify_attn as va

        s = case.shape
        extra = {"kv_slot_runs": case.kv_slot_runs} if case.kv_slot_runs > 1 else {}
        extra.update(_splits_kw(self.num_splits))
        kc, _, kv = self._caches(inputs)
        extra.update(kv)
        return va.TreeAttentionPlan(
            case.qo_indptr, case.kv_indptr_pages, case.kv_indices, case.kv_len,
            num_qo_heads=s.heads, num_kv_heads=kc.shape[-2], head_dim_qk=inputs.q.shape[-1],
            head_dim_vo=s.d_vo, page_size=case.page_size, tree_mask=case.tree_mask,
            sm_scale=case.sm_scale, dtype=case.dtype, max_q_len=case.max_q_len,
            max_kv_len=case.max_kv_len, tuning=self.tuning(), **extra)

    def prepare(self, case, inputs):
        import torch

        s = case.shape
        out = torch.empty((case.total_q, s.heads, s.d_vo), dtype=case.dtype, device=case.device)
        plan = self._plan(case, inputs)
        q = inputs.q
        kc, vc, _ = self._caches(inputs)

        def run():
            plan.run(q, kc, vc, out=out)
            return out

        return run

    def plan(self, case, inputs):
        """The plan's info for the row (kernel config name, splits, maps)."""
        kc, vc, _ = self._caches(inputs)
        return self._plan(case, inputs).info(inputs.q, kc, vc)


class OursPagedFp8(OursPaged):
    """The paged kernel on an fp8 (e4m3) copy of the row's caches (bench
    ``--kv_dtype=fp8_e4m3``), column ``ours_paged@fp8``: each cache divided by
    its per-tensor scale ``amax / 448`` (e4m3's largest value) and rounded
    (:mod:`benchlib.fp8`), the scales passed as ``k_scale`` / ``v_scale``. Its error column is against the
    float64 result of the q-dtype cache it was quantized from, quantization
    included (``tol``); the kernels' own error against the dequantized cache is
    what python/tests/test_fp8_gpu.py asserts. Every shape: GQA / MHA and MLA
    (its one cache, ``k_scale`` only); ``max_smem_bytes`` as for
    :class:`OursPaged` (column ``ours_paged@fp8_<tag>``)."""

    tol = 5e-2

    def __init__(self, num_splits=0, max_smem_bytes=0, tag=None):
        super().__init__(num_splits=num_splits, max_smem_bytes=max_smem_bytes,
                         tag=f"fp8_{tag}" if tag else "fp8")
        self.check_vs_ours = False

    def _caches(self, inputs):
        import torch

        from . import fp8

        k8, ks, v8, vs = fp8.SHARED.get(inputs)  # MLA: v8 None, the values take k_scale
        scales = {"k_scale": ks} if vs is None else {"k_scale": ks, "v_scale": vs}
        return k8, v8, {"kv_dtype": torch.float8_e4m3fn, **scales}
