"""GPU tests of one contract: however a launch is made, it gives the eager,
synchronized result, which equals the float64 reference.

* a TreeAttentionPlan captured in a CUDA graph, replayed with new lengths, trees,
  pages and values written into the planned buffers in place (every replay
  equals the eager call on the same inputs and the reference); with the
  kv_slot_runs hint on sm_90a (the TMA kernel's tensor map is a by-value kernel
  argument, captured);
* the functional call captured in a CUDA graph and replayed over new device data
  (nothing but the host bounds is baked in), and refused during capture without
  bounds;
* torch.compile(fullgraph=True) of calls with and without ``out=``, and
  torch.library.opcheck of the custom op;
* programmatic dependent launch (kernels/pdl_launch.h, kernels/core/pdl.cuh): on
  sm_90 the MLA kernels are launched as programmatic dependents: they may be
  scheduled while the previous kernel of the stream runs, must not touch memory
  before it has completed (griddepcontrol.wait), and let the next one start
  before their own epilogue. A chain of calls on one stream in which every call
  reads, as part of its K cache, the output the call before it wrote (``out`` is
  a view into the other of two caches), with no synchronization between the
  calls, eager and as one CUDA graph, must equal, bit for bit, the same chain
  with the device synchronized between calls (the kernels are deterministic),
  and its last step the reference of its inputs. page_size 64 runs the TMA
  kernel, page_size 1 the cp.async one; one split (the attention kernel writes
  ``out`` itself, after letting the next launch start) and three (the split-K
  merge writes it).

Problems, run, reference and checks: verify_attn.testing.
"""

import math
import random

import pytest
import torch

import verify_attn
from verify_attn import masks, testing
from verify_attn.testing import CP_ASYNC_MLA, TMA_MLA, TMA_ROWS_MLA, new_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEV = "cuda"


def small_problem(seed, *, model="mla_h16", layout="paged", page_size=16, tree="ddtree", q_len=40,
                  prefix=300, batch=3, **kw):
    """Three ragged requests (the longest 40 drafts over a 300-row prefix), random values
    everywhere in the cache, three unused trailing kv_indices entries."""
    q_lens, prefixes = testing.ragged_lengths(random.Random(seed), batch, q_len, prefix)
    return testing.make_problem(q_lens, prefixes, model=model, layout=layout, page_size=page_size, tree=tree,
                                poison=False, unused_indices=3, seed=seed, device=DEV, **kw)


# ---------------------------------------------------------------------------
# TreeAttentionPlan in CUDA graphs


@pytest.mark.parametrize("ps", [16, 64], ids=["page16", "page64"])
@pytest.mark.parametrize("mla", [True, False])
def test_graph_replay_with_new_lengths(mla, ps):
    """page64 + MLA on sm_90: the TMA kernel (its tensor map is a by-value kernel argument, captured)."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    dev, dt = DEV, torch.bfloat16
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
        """New lengths, trees, pages and values, written in place; the problem they make."""
        q_lens = [rng.randint(1, max_q) for _ in range(B)]
        kv_lens = [rng.randint(0, max_prefix) + t for t in q_lens]
        total = sum(q_lens)
        # The planned row count is fixed: unused tail rows belong to no request
        # (qo_indptr[B] = total <= capacity); the kernel does not touch them.
        testing.write_batch(q_lens, kv_lens, qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_len=kv_len, tree_mask=tree, page_size=ps, num_pages=num_pages, max_q_len=max_q,
                            rng=rng)
        q.normal_()
        k.normal_()
        if v is not None:
            v.normal_()
        return testing.Problem(q=q[:total], k=k, v=v, qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices,
                               kv_len=kv_len, tree_mask=tree[:total], max_q_len=max_q, max_kv_len=max_kv,
                               q_lens=q_lens, kv_lens=kv_lens, mla=mla, d_vo=dvo, seed=seed)

    fill()
    out = torch.empty(B * max_q, H, dvo, device=dev, dtype=dt)
    lse = torch.empty(B * max_q, H, device=dev, dtype=torch.float32)
    plan = verify_attn.TreeAttentionPlan(
        qo, kv_indptr, kv_indices, kv_len, num_qo_heads=H, num_kv_heads=hkv, head_dim_qk=dqk,
        head_dim_vo=dvo, tree_mask=tree, dtype=dt, max_q_len=max_q, max_kv_len=max_kv, num_splits=3)
    info = plan.info(q, k, v, out=out, lse=lse)
    assert info["num_splits"] == 3 and info["workspace_bytes"] > 0
    if mla and torch.cuda.get_device_capability() == (9, 0):
        tma = ps % 64 == 0
        assert info["name"].endswith(TMA_MLA if tma else CP_ASYNC_MLA) and info["k_tma"] == tma, info
    g = testing.captured(lambda: plan.run(q, k, v, out=out, lse=lse))
    assert plan.plans_made == 1
    for step in range(4):
        p = fill()
        total = p.total_q
        got, got_lse = testing.replayed(g, out, lse, total)
        # The same plan run eagerly, and the one-shot call: the same bits.
        eager, eager_lse = plan.run(q, k, v, return_lse=True)
        assert torch.equal(got, eager[:total]), (seed, step)
        assert torch.equal(got_lse, eager_lse[:total]), (seed, step)
        once, once_lse = testing.call(p, return_lse=True, num_splits=3)
        assert torch.equal(got, once), (seed, step)
        assert torch.equal(got_lse, once_lse), (seed, step)
        testing.check(p, got, got_lse, label=f"[seed {seed} step {step}]")
    assert plan.plans_made == 2  # the layout with out / lse, and the one that allocates them


@pytest.mark.parametrize("mla", [True, False])
def test_one_plan_many_layers(mla):
    """A batch planned once and run for six layers (each its own q and caches): every layer
    against the float64 reference, one C plan for all of them."""
    seed = new_seed()
    p0 = testing.make_problem([5, 16, 9], [300, 1000, 70], model="mla_h16" if mla else "gqa_d128_g4",
                              layout="paged", page_size=16, seed=seed, device=DEV)
    plan = testing.plan(p0)
    for layer in range(6):
        # This layer's q and caches (the batch's indices, mask and lengths are the plan's).
        scale = 0.5 + 0.1 * layer
        p = p0.replace(q=torch.randn_like(p0.q), k=p0.k * scale,
                       v=None if p0.v is None else p0.v * (2.0 - scale), ref_k=None, ref_v=None)
        out, lse = testing.poisoned_outputs(p)
        testing.run_plan(plan, p, out=out, lse=lse)
        testing.check(p, out, lse, label=f"[seed {seed} layer {layer}]")
    assert plan.plans_made == 1


@pytest.mark.usefixtures("sm90_tma_env")  # conftest.py: sm_90 only, the plan's own kernel path
def test_kv_slot_runs_hint_in_a_cuda_graph_plan():
    """TreeAttentionPlan with the hint: plans the TMA kernel, replays in a CUDA graph with new slots."""

    def make(seed, kinds):
        return testing.make_problem([16, 16], [600, 600], model="mla_h16", layout="paged", page_size=1,
                                    slots=kinds, cache_3d=True, kv_slot_runs=64, seed=seed, device=DEV)

    p = make(8, ["runs", "scattered"])
    plan = testing.plan(p)
    out, lse = testing.poisoned_outputs(p)
    info = plan.info(p.q, p.k, out=out, lse=lse)
    assert info["name"].endswith(TMA_ROWS_MLA) and info["k_tma"], info
    testing.run_plan(plan, p, out=out, lse=lse)
    torch.cuda.synchronize()
    g = testing.captured(lambda: testing.run_plan(plan, p, out=out, lse=lse))
    b = make(9, ["scattered", "runs"])
    for n in ("q", "k", "kv_indices", "tree_mask"):
        getattr(p, n).copy_(getattr(b, n))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    testing.check(p, out, lse)


# ---------------------------------------------------------------------------
# the functional call in CUDA graphs, torch.compile, opcheck


@pytest.mark.parametrize("splits", [0, 3])
def test_cuda_graph_capture_and_replay(splits):
    seed = new_seed()
    rng = random.Random(seed)
    p = small_problem(seed, page_size=1, cache_3d=True, tree="random")

    def step():
        return testing.call(p, return_lse=True, num_splits=splits)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out, static_lse = step()
    g.replay()
    torch.cuda.synchronize()
    testing.check(p, static_out, static_lse, label=f"[graph replay 1 seed={seed}]", lse_rtol=testing.LSE_RTOL)

    # New device data in the same buffers -- values, page order, tree bits and KV lengths
    # (within the bounds): the replay must follow them, nothing but the host bounds is baked in.
    p.q.copy_(torch.randn(p.q.shape, device=DEV).to(p.q.dtype))
    p.k.copy_(torch.randn(p.k.shape, device=DEV).to(p.k.dtype))
    p.kv_indices.copy_(p.kv_indices[torch.randperm(p.kv_indices.numel(), device=DEV)])
    new_kv = [rng.randint(n, kv) for n, kv in zip(p.q_lens, p.kv_lens)]
    p.kv_len.copy_(torch.tensor(new_kv, dtype=torch.int32))
    p.kv_lens = new_kv
    parents = []
    for n in p.q_lens:
        parents += testing.random_parents("deep", n, rng=rng)
    new_mask = masks.from_parents(torch.tensor(parents, dtype=torch.int32, device=DEV), p.qo_indptr,
                                  max_q_len=p.tree_mask.shape[1] * 32)
    p.tree_mask.copy_(new_mask)
    g.replay()
    torch.cuda.synchronize()
    testing.check(p, static_out, static_lse, label=f"[graph replay 2 seed={seed}]", lse_rtol=testing.LSE_RTOL)
    eager_out, eager_lse = step()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, eager_out, rtol=0, atol=0)
    torch.testing.assert_close(static_lse, eager_lse, rtol=0, atol=0)


def test_cuda_graph_capture_needs_bounds():
    p = small_problem(new_seed(), layout="flat").replace(max_q_len=None)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=r"^max_q_len: must be passed explicitly"):
        with torch.cuda.graph(g):
            testing.call(p, return_lse=True)


def test_torch_compile_fullgraph():
    seed = new_seed()
    p = small_problem(seed, page_size=64, model="gqa_d128_g4", tree="random")
    H, d_vo = p.heads, p.d_vo

    def fn(q, k, v, qo, kv_indptr, kv_indices, kv_len, mask):
        out, lse = verify_attn.tree_attention_paged(
            q * 1.0, k, v, qo, kv_indptr, kv_indices, kv_len, tree_mask=mask,
            max_q_len=p.max_q_len, max_kv_len=p.max_kv_len, return_lse=True)
        out2 = torch.full((q.shape[0], H, d_vo), float("nan"), dtype=q.dtype, device=q.device)
        verify_attn.tree_attention_paged(q, k, v, qo, kv_indptr, kv_indices, kv_len, tree_mask=mask,
                                         max_q_len=p.max_q_len, max_kv_len=p.max_kv_len, out=out2, num_splits=3)
        return out, lse * 2.0, out2, out.float().sum()

    args = (p.q, p.k, p.v, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_len, p.tree_mask)
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True)(*args)
    torch.cuda.synchronize()
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0, msg=f"seed={seed}")
    torch.testing.assert_close(compiled[1], eager[1], rtol=0, atol=0, msg=f"seed={seed}")
    torch.testing.assert_close(compiled[2], eager[2], rtol=0, atol=0, msg=f"seed={seed}")
    testing.check(p, compiled[0], compiled[1] / 2.0, label=f"[compile seed={seed}]", lse_rtol=testing.LSE_RTOL)
    testing.check(p, compiled[2], None, label=f"[compile out= seed={seed}]")


def test_opcheck():
    p = small_problem(new_seed(), model="gqa_d64_g8", q_len=20, prefix=50)
    args = (p.q, p.k, p.v, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_len, p.tree_mask,
            1, 16, False, 1.0 / math.sqrt(p.q.shape[-1]), p.d_vo, p.max_q_len, p.max_kv_len, 0, True,
            "", [0, 0, 0, 0, 0])  # the tuning: the plan's choices
    torch.library.opcheck(torch.ops.verify_attn.tree_attention.default, args)


# ---------------------------------------------------------------------------
# programmatic dependent launch: chained calls reading the previous call's output

H, T, B, L, STEPS = 16, 4, 32, 1024, 4  # 32 requests x 4 drafts x 16 heads = 2048 output rows


def setup(ps, seed):
    """Two caches of random values (every page a request's), the problem over the first."""
    p = testing.make_problem([T] * B, [L - T] * B, model="mla_h16", layout="paged", page_size=ps, spare_pages=0,
                             poison=False, seed=seed, device=DEV)
    assert p.k.shape[0] * ps >= B * T * H  # every output row lands in the other cache
    return [p.k, torch.randn(p.k.shape, device=DEV).to(p.k.dtype)], p


def out_view(cache):
    """[B*T, H, 512] rows of 576-element cache rows: the next call's K (first 512 dims)."""
    return cache.view(-1, 576)[: B * T * H, :512].view(B * T, H, 512)


def chain(caches, p, splits, sync):
    for step in range(STEPS):
        src, dst = caches[step % 2], caches[(step + 1) % 2]
        testing.call(p.replace(k=src), num_splits=splits, out=out_view(dst))
        if sync:
            torch.cuda.synchronize()


@pytest.mark.parametrize("splits", [1, 3], ids=["splits1", "splits3"])
@pytest.mark.parametrize("ps", [64, 1], ids=["page64", "page1"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_chain_reads_the_previous_output(ps, splits, graph):
    seed = random.randrange(1 << 30)
    caches, p = setup(ps, seed)
    assert (p.max_q_len, p.max_kv_len) == (T, L)
    start = [c.clone() for c in caches]
    expect = [c.clone() for c in start]
    chain(expect, p, splits, sync=True)
    got = [c.clone() for c in start]
    if graph:
        chain(got, p, splits, sync=False)  # warm-up (plans, workspace) outside the capture
        for c, s in zip(got, start):
            c.copy_(s)
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            chain(got, p, splits, sync=False)
        for c, s in zip(got, start):
            c.copy_(s)
        torch.cuda.synchronize()
        gr.replay()
    else:
        chain(got, p, splits, sync=False)
    torch.cuda.synchronize()
    for i in range(2):
        assert torch.equal(got[i], expect[i]), f"seed {seed}: cache {i} differs from the synchronized chain"
    src = expect[(STEPS - 1) % 2]  # the last step's K (that step wrote only the other cache)
    testing.check(p.replace(k=src), out_view(expect[STEPS % 2]), label=f"[seed {seed}]")


# ---------------------------------------------------------------------------
# the one-shot functions' plans (verify_attn.attention._ONESHOT_PLANS)


@pytest.mark.parametrize("mla", [True, False])
def test_oneshot_calls_reuse_the_batch_plan(mla):
    """Eager one-shot calls with one batch's tensors and host bounds plan once (a model calling
    the function per layer); every call matches the reference, new contents of the planned
    index tensors included; another batch tensor, or bounds left to the host, plan anew."""
    from verify_attn import attention

    seed = new_seed()
    model = "mla_h16" if mla else "gqa_d128_g4"
    p = testing.make_problem([5, 16, 9], [300, 1000, 70], model=model, layout="paged", page_size=16,
                             seed=seed, device=DEV)
    attention._ONESHOT_PLANS.clear()
    for layer in range(4):
        q = torch.randn_like(p.q)
        out, lse = testing.run(p.replace(q=q))
        testing.check(p.replace(q=q), out, lse, label=f"[seed {seed} layer {layer}]")
    assert len(attention._ONESHOT_PLANS) == 1
    (plan,) = attention._ONESHOT_PLANS.values()
    assert plan.plans_made == 1
    # New contents of the planned tensors (a new batch written in place): still exact.
    b = testing.make_problem([5, 16, 9], [300, 1000, 70], model=model, layout="paged", page_size=16,
                             seed=seed + 1, device=DEV)
    for n in ("q", "k", "kv_indices", "tree_mask"):
        getattr(p, n).copy_(getattr(b, n))
    if not mla:
        p.v.copy_(b.v)
    out, lse = testing.run(p)
    testing.check(p, out, lse, label=f"[seed {seed} refilled]")
    assert len(attention._ONESHOT_PLANS) == 1
    # Another tree_mask tensor: a new plan.
    out, lse = testing.run(p.replace(tree_mask=p.tree_mask.clone()))
    testing.check(p, out, lse)
    assert len(attention._ONESHOT_PLANS) == 2
