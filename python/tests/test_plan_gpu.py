"""Plan/run: one host plan, CUDA-graph replays with new lengths, trees, pages
and values written into the planned buffers in place; every replay equals the
eager call on the same inputs and the float64 reference."""

import random

import pytest
import torch

import verify_attn
from verify_attn import masks, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("ps", [16, 64], ids=["page16", "page64"])
@pytest.mark.parametrize("mla", [True, False])
def test_graph_replay_with_new_lengths(mla, ps):
    """page64 + MLA on sm_90: the TMA kernel (its tensor map is a by-value kernel argument, captured)."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    B, max_q, max_prefix = 4, 24, 3000
    H, hkv, dqk, dvo = (16, 1, 576, 512) if mla else (12, 4, 128, 128)
    max_kv = max_prefix + max_q
    pages_per_req = (max_kv + ps - 1) // ps
    num_pages = B * pages_per_req + 8
    # Static buffers at capacity.
    q = torch.empty(B * max_q, H, dqk, device=dev, dtype=dt)
    k = torch.randn(num_pages, ps, hkv, dqk, device=dev, dtype=dt)
    v = None if mla else torch.randn(num_pages, ps, hkv, dvo, device=dev, dtype=dt)
    qo = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    kv_indices = torch.zeros(B * pages_per_req, dtype=torch.int32, device=dev)
    kv_len = torch.zeros(B, dtype=torch.int32, device=dev)
    tree = torch.zeros(B * max_q, masks.mask_words(max_q), dtype=torch.int32, device=dev)

    def fill():
        """New lengths, trees, pages and values, written in place."""
        q_lens = [rng.randint(1, max_q) for _ in range(B)]
        kv_lens = [rng.randint(0, max_prefix) + t for t in q_lens]
        total = sum(q_lens)
        qo_h = [0]
        for t in q_lens:
            qo_h.append(qo_h[-1] + t)
        # The planned row count is fixed: unused tail rows belong to no request
        # (qo_indptr[B] = total <= capacity); the kernel does not touch them.
        pages = [(n + ps - 1) // ps for n in kv_lens]
        ind_h = [0]
        for n in pages:
            ind_h.append(ind_h[-1] + n)
        qo.copy_(torch.tensor(qo_h, dtype=torch.int32))
        kv_indptr.copy_(torch.tensor(ind_h, dtype=torch.int32))
        kv_indices[: ind_h[-1]].copy_(torch.randperm(num_pages, device=dev)[: ind_h[-1]].to(torch.int32))
        kv_len.copy_(torch.tensor(kv_lens, dtype=torch.int32))
        parents = []
        for t in q_lens:
            parents += masks.random_parents(rng.choice(["ddtree", "random", "chain"]), t, rng=rng)
        tree.zero_()
        tree[:total].copy_(masks.from_parents(torch.tensor(parents, dtype=torch.int32, device=dev),
                                              qo, max_q_len=max_q))
        q.normal_()
        k.normal_()
        if v is not None:
            v.normal_()
        return total

    fill()
    plan = verify_attn.TreeAttentionPlan(
        q, k, v, qo, kv_indptr, kv_indices, kv_len, tree_mask=tree, max_q_len=max_q,
        max_kv_len=max_kv, return_lse=True, num_splits=3)
    assert plan.info["num_splits"] == 3 and plan.info["workspace_bytes"] > 0
    if mla and torch.cuda.get_device_capability() == (9, 0):
        tma = ps % 64 == 0
        assert plan.info["name"].endswith("mla_wgmma_seesaw_tma" if tma else "mla_wgmma_m64n64_pipe_rows"), plan.info
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run()  # warm up outside capture
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            plan.run()
    torch.cuda.current_stream().wait_stream(s)
    for step in range(4):
        total = fill()
        plan.out.fill_(float("nan"))
        plan.lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        out, lse = plan.out[:total].clone(), plan.lse[:total].clone()
        eager, eager_lse = verify_attn.tree_attention_paged(
            q[:total], k, v, qo, kv_indptr, kv_indices, kv_len, tree_mask=tree[:total],
            max_q_len=max_q, max_kv_len=max_kv, return_lse=True, num_splits=3)
        assert torch.equal(out, eager), (seed, step)
        assert torch.equal(lse, eager_lse), (seed, step)
        ref, ref_lse = reference.reference_attention_paged(
            q[:total], k, v, qo, kv_indptr, kv_indices, kv_len, tree_mask=tree[:total])
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2 and torch.isfinite(out).all(), (seed, step, err)
        assert (lse.double() - ref_lse).abs().max().item() < 1e-2, (seed, step)
