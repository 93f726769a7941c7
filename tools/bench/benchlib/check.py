"""Verification before timing.

Every implementation's output is compared with the float64 PyTorch reference
(:func:`verify_attn.reference.reference_attention_flat`) before it is timed:

- small shapes: the reference over every request (``check = "ref"``);
- big shapes (the reference's logits would pass ``REF_WORK_CAP``): the
  reference over a subsample of requests (the first and the last; ``check =
  "ref[k/B]"``), and every baseline additionally against this project's paged
  kernel over all rows (``err_vs_ours``), after our kernel passed on the
  subsample.

The error is ``||out - ref||_F / ||ref||_F`` per request, maximum over the
checked requests (the GPU tests' 1e-2 criterion); an implementation above
``TOL`` is marked WRONG in the table (timed anyway, never a speedup basis).
"""

import dataclasses
from typing import Dict, List, Optional

import torch

from verify_attn.reference import reference_attention_flat

TOL = 2e-2
REF_WORK_CAP = 2.0e8        # sum over checked requests of H * T * (L + T)
REF_REQUEST_CAP = 6.0e8     # one request above this is not referenced at all


@dataclasses.dataclass
class Reference:
    requests: List[int]        # checked request ids
    outs: Dict[int, torch.Tensor]   # request -> float64 [T_i, H, Dvo]
    label: str                 # "ref" or "ref[k/B]" or "none"


def _work(case, i) -> float:
    s = case.shape
    return float(s.heads) * case.q_lens[i] * case.kv_lens[i]


def choose_requests(case) -> List[int]:
    B = case.batch
    total = sum(_work(case, i) for i in range(B))
    if total <= REF_WORK_CAP:
        return [i for i in range(B) if case.q_lens[i] > 0]
    picks = []
    for i in ([0, B - 1] if B > 1 else [0]):
        if case.q_lens[i] > 0 and _work(case, i) <= REF_REQUEST_CAP and i not in picks:
            picks.append(i)
    return picks


def _all_visible(n: int, words: int, device) -> torch.Tensor:
    """Compact mask rows under which each of ``n`` drafts sees all ``n`` (no masking)."""
    bits = torch.zeros(n, words, dtype=torch.int32, device=device)
    for w in range(words):
        c = min(32, n - 32 * w)
        if c > 0:
            bits[:, w] = -1 if c == 32 else (1 << c) - 1
    return bits


def reference(case, inputs, compute_dtype=torch.float64, causal: bool = False,
              dense: bool = False) -> Reference:
    """float64 reference outputs of the chosen requests (on the case's device).

    ``causal=True``: the reference of the causal CHAIN of the same shape (draft ``t``
    sees the prefix and drafts ``0..t``), whatever the case's tree: the check of a
    chain-only implementation run on a tree row (FlashMLA, ``computes = "chain"``).
    ``dense=True``: the unmasked problem of the same shape (every draft sees every
    row): the check of a dense attention kernel (``computes = "dense"``).
    """
    reqs = choose_requests(case)
    s = case.shape
    outs = {}
    qo = case.qo_indptr.tolist()
    kvp = case.kv_indptr_flat.tolist()
    for i in reqs:
        q = inputs.q[qo[i]:qo[i + 1]]
        k = inputs.k_flat[kvp[i]:kvp[i + 1]]
        v = None if inputs.v_flat is None else inputs.v_flat[kvp[i]:kvp[i + 1]]
        if dense:
            tm = _all_visible(q.shape[0], case.tree_mask.shape[1], q.device)
        else:
            tm = None if causal else case.tree_mask[qo[i]:qo[i + 1]]
        one_q = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
        one_kv = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=q.device)
        o, _ = reference_attention_flat(
            q, k, v, one_q, one_kv, tree_mask=tm, causal=causal, sm_scale=case.sm_scale,
            head_dim_vo=s.d_vo, compute_dtype=compute_dtype)
        outs[i] = o
    if not reqs:
        label = "none"
    elif len(reqs) == case.batch:
        label = "ref"
    else:
        label = f"ref[{len(reqs)}/{case.batch}]"
    return Reference(reqs, outs, label)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o = out.to(torch.float64)
    r = ref.to(torch.float64)
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    den = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(o - r))
    return num / den if den > 0 else num


def err_vs_reference(out: torch.Tensor, case, ref: Reference) -> Optional[float]:
    """Max per-request relative error of ``out`` ``[total_q, H, Dvo]`` on the checked requests."""
    if not ref.requests:
        return None
    qo = case.qo_indptr.tolist()
    worst = 0.0
    for i in ref.requests:
        worst = max(worst, rel_err(out[qo[i]:qo[i + 1]], ref.outs[i]))
    return worst


def err_vs(out: torch.Tensor, other: torch.Tensor) -> float:
    return rel_err(out, other)
