"""Programmatic dependent launch (kernels/pdl_launch.h, kernels/core/pdl.cuh).

On sm_90 the MLA kernels are launched as programmatic dependents: they may be
scheduled while the previous kernel of the stream runs, must not touch memory
before it has completed (griddepcontrol.wait), and let the next one start before
their own epilogue. This checks the ordering where it matters: a chain of calls
on one stream in which every call reads, as part of its K cache, the output the
call before it wrote (``out`` is a view into the other of two caches), with no
synchronization between the calls, eager and as one CUDA graph. Each chain must
equal, bit for bit, the same chain with the device synchronized between calls
(the kernels are deterministic), and its last step the float64 reference of its
inputs. page_size 64 runs the TMA kernel, page_size 1 the cp.async one; one
split (the attention kernel writes ``out`` itself, after letting the next launch
start) and three (the split-K merge writes it).
"""

import random

import pytest
import torch

import verify_attn
from verify_attn import masks, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
H, T, B, L, STEPS = 16, 4, 32, 1024, 4  # 32 requests x 4 drafts x 16 heads = 2048 output rows


def setup(ps, seed):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    pages_per_req = L // ps
    num_pages = B * pages_per_req
    assert num_pages * ps >= B * T * H  # every output row lands in the other cache
    caches = [torch.randn(num_pages, ps, 1, 576, generator=g).to(torch.bfloat16).cuda() for _ in range(2)]
    q = torch.randn(B * T, H, 576, generator=g).to(torch.bfloat16).cuda()
    qo = (torch.arange(B + 1, dtype=torch.int32) * T).cuda()
    kv_indptr = (torch.arange(B + 1, dtype=torch.int32) * pages_per_req).cuda()
    kv_indices = torch.randperm(num_pages, generator=g).to(torch.int32).cuda()
    kv_len = torch.full((B,), L, dtype=torch.int32).cuda()
    parents = [x for _ in range(B) for x in masks.random_parents("random", T, rng=rng)]
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo.cpu()).cuda()
    return caches, dict(q=q, qo=qo, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len=kv_len, tree=tree)


def out_view(cache):
    """[B*T, H, 512] rows of 576-element cache rows: the next call's K (first 512 dims)."""
    return cache.view(-1, 576)[: B * T * H, :512].view(B * T, H, 512)


def chain(caches, a, splits, sync):
    for step in range(STEPS):
        src, dst = caches[step % 2], caches[(step + 1) % 2]
        verify_attn.tree_attention_paged(a["q"], src, None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                         a["kv_len"], tree_mask=a["tree"], max_q_len=T, max_kv_len=L,
                                         num_splits=splits, out=out_view(dst))
        if sync:
            torch.cuda.synchronize()


@pytest.mark.parametrize("splits", [1, 3], ids=["splits1", "splits3"])
@pytest.mark.parametrize("ps", [64, 1], ids=["page64", "page1"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_chain_reads_the_previous_output(ps, splits, graph):
    seed = random.randrange(1 << 30)
    caches, a = setup(ps, seed)
    start = [c.clone() for c in caches]
    expect = [c.clone() for c in start]
    chain(expect, a, splits, sync=True)
    got = [c.clone() for c in start]
    if graph:
        chain(got, a, splits, sync=False)  # warm-up (plans, workspace) outside the capture
        for c, s in zip(got, start):
            c.copy_(s)
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            chain(got, a, splits, sync=False)
        for c, s in zip(got, start):
            c.copy_(s)
        torch.cuda.synchronize()
        gr.replay()
    else:
        chain(got, a, splits, sync=False)
    torch.cuda.synchronize()
    for i in range(2):
        assert torch.equal(got[i], expect[i]), f"seed {seed}: cache {i} differs from the synchronized chain"
    src = expect[(STEPS - 1) % 2]  # the last step's K (that step wrote only the other cache)
    ro, _ = reference.reference_attention_paged(a["q"], src, None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                                a["kv_len"], tree_mask=a["tree"])
    last = out_view(expect[STEPS % 2]).double()
    assert torch.isfinite(last).all()
    err = ((last - ro).norm() / ro.norm()).item()
    assert err < 1e-2, f"seed {seed}: rel err {err}"
