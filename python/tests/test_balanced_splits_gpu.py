"""GPU tests of balanced splits (``Tuning.balance_splits``, kernels/core/balanced_splits.cuh):
the split CTAs of each (KV head, row tile) go to a batch's requests by their device KV
lengths, a long request taking more splits than a short one.

* ragged batches on the GQA warp-role kernels (16 and 32 rows per consumer warp), paged
  (page_size 1 and 16) and flat, bf16 and fp16, balanced by request (``balance_splits=True``;
  the plan's own rule balances only where a split holds 8 KV tiles, tested in
  kernels/tests/plan_test.cc): the plan balances (``split_units`` > 0), and the result
  matches the float64 reference, as the unbalanced plan's does;
* one CUDA graph, planned and captured once, replayed with new lengths whose longest request
  moves from slot to slot of the batch: the allocation follows the device lengths (every
  replay equals the eager run of the same plan bit for bit, and the reference);
* workspace slots past a request's splits hold an earlier call's partial rows (a call with
  every request long, then one with short ones): never merged in;
* a bad page id, and a device kv_len < q_len, in one request of a balanced batch: flagged,
  that request's rows NaN, the other requests exact.

Problems, run, reference and checks: verify_attn.testing.
"""

import random

import pytest
import torch

import verify_attn
from verify_attn import masks, testing
from verify_attn.testing import new_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEV = "cuda"
GQA128 = testing.Model(mla=False, heads=8, kv_heads=2, d_qk=128, d_vo=128)
GQA64 = testing.Model(mla=False, heads=9, kv_heads=3, d_qk=64, d_vo=64)
# (forced configuration, model, draft counts): 4 or 3 query heads per KV head, so 16 drafts
# make 64 or 48 rows per KV head (one 128-row tile) and 64 drafts 256 (one 256-row tile).
CONFIGS = {
    "roles_m128_d128": (testing.ROLES_GQA[128], GQA128, 16),
    "roles_m128_d128_s3": (testing.ROLES_S3_GQA[128], GQA128, 16),
    "roles_m128_d64": (testing.ROLES_GQA[64], GQA64, 16),
    "roles_m256_d128": (testing.ROLES_R32_GQA[128], GQA128, 64),
}


def ragged(seed, model, q_len, layout="paged", page_size=1, dtype=torch.bfloat16, batch=None):
    """A batch of 2-7 requests: one with a long prefix (3,000-6,000 rows), the others 0-1,500,
    in random order; draft counts 1..q_len; random trees."""
    rng = random.Random(seed)
    b = batch or rng.randint(2, 7)
    long_one = rng.randrange(b)
    prefixes = [rng.randint(3000, 6000) if i == long_one else rng.randint(0, 1500) for i in range(b)]
    q_lens = [q_len if i == long_one else rng.randint(1, q_len) for i in range(b)]
    return testing.make_problem(q_lens, prefixes, model=model, dtype=dtype, layout=layout, page_size=page_size,
                                tree="random", poison=False, seed=seed, device=DEV)


def _balanced_info(p):
    info = testing.plan_info(p)
    assert info["split_units"] >= 2 * len(p.q_lens) and info["num_splits"] >= 2, info
    return info


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout,page_size", [("paged", 1), ("paged", 16), ("flat", None)],
                         ids=["page1", "page16", "flat"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_balanced_batch_matches_reference(config, layout, page_size, dtype):
    tag, model, q_len = CONFIGS[config]
    seed = new_seed()
    p = ragged(seed, model, q_len, layout=layout, page_size=page_size or 1, dtype=dtype)
    with testing.kernel_path(testing.KernelPath(config=tag, balance_splits=True)):
        if tag == testing.ROLES_S3_GQA[128] and not testing.plan_info(p)["name"].endswith(tag):
            pytest.skip(f"{tag} does not fit this device's shared memory")
        info = _balanced_info(p)
        assert info["name"].endswith(tag), info
        out, lse = testing.run(p)
        ref = testing.reference(p)
        testing.check(p, out, lse, ref=ref, label=f"[seed {seed}] balanced {info['split_units']} units")
    with testing.kernel_path(testing.KernelPath(config=tag, balance_splits=False)):
        info = testing.plan_info(p)
        assert info["split_units"] == 0, info
        out_u, lse_u = testing.run(p)
        testing.check(p, out_u, lse_u, ref=ref, label=f"[seed {seed}] unbalanced {info['num_splits']} splits")


def test_forced_split_count_is_not_balanced():
    p = ragged(new_seed(), GQA128, 16)
    with testing.kernel_path(testing.KernelPath(config=testing.ROLES_GQA[128], balance_splits=True)):
        assert testing.plan_info(p)["split_units"] > 0
        info = testing.plan_info(p, num_splits=5)
        assert info["split_units"] == 0 and info["num_splits"] == 5, info


def test_graph_replay_rebalances_with_new_lengths():
    seed = new_seed()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    dt, ps = torch.bfloat16, 16
    B, max_q, max_prefix = 4, 16, 4000
    H, hkv, d = 8, 2, 128
    max_kv = max_prefix + max_q
    pages_per_req = (max_kv + ps - 1) // ps
    num_pages = B * pages_per_req + 8
    q = torch.empty(B * max_q, H, d, device=DEV, dtype=dt)
    k = torch.empty(num_pages, ps, hkv, d, device=DEV, dtype=dt)
    v = torch.empty(num_pages, ps, hkv, d, device=DEV, dtype=dt)
    qo = torch.zeros(B + 1, dtype=torch.int32, device=DEV)
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32, device=DEV)
    kv_indices = torch.zeros(B * pages_per_req, dtype=torch.int32, device=DEV)
    kv_len = torch.zeros(B, dtype=torch.int32, device=DEV)
    tree = torch.zeros(B * max_q, masks.mask_words(max_q), dtype=torch.int32, device=DEV)

    def fill(long_one):
        """New lengths (request long_one near the bound, the others short), trees, pages and
        values, written in place; the problem they make."""
        q_lens = [rng.randint(1, max_q) for _ in range(B)]
        prefixes = [rng.randint(3000, max_prefix) if i == long_one else rng.randint(0, 600) for i in range(B)]
        kv_lens = [pre + t for pre, t in zip(prefixes, q_lens)]
        testing.write_batch(q_lens, kv_lens, qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_len=kv_len, tree_mask=tree, page_size=ps, num_pages=num_pages, max_q_len=max_q,
                            rng=rng)
        total = sum(q_lens)
        q.normal_()
        k.normal_()
        v.normal_()
        return testing.Problem(q=q[:total], k=k, v=v, qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices,
                               kv_len=kv_len, page_size=ps, tree_mask=tree[:total], max_q_len=max_q,
                               max_kv_len=max_kv, q_lens=q_lens, kv_lens=kv_lens, mla=False, d_vo=d, seed=seed)

    fill(0)
    out = torch.empty(B * max_q, H, d, device=DEV, dtype=dt)
    lse = torch.empty(B * max_q, H, device=DEV, dtype=torch.float32)
    plan = verify_attn.TreeAttentionPlan(
        qo, kv_indptr, kv_indices, kv_len, num_qo_heads=H, num_kv_heads=hkv, head_dim_qk=d, head_dim_vo=d,
        page_size=ps, tree_mask=tree, dtype=dt, max_q_len=max_q, max_kv_len=max_kv,
        tuning=verify_attn.Tuning(config=testing.ROLES_GQA[128], balance_splits=True))
    info = plan.info(q, k, v, out=out, lse=lse)
    assert info["split_units"] > 0 and info["workspace_bytes"] > 0, info
    g = testing.captured(lambda: plan.run(q, k, v, out=out, lse=lse))
    for step in range(2 * B):
        p = fill(step % B)
        total = p.total_q
        got, got_lse = testing.replayed(g, out, lse, total)
        eager, eager_lse = plan.run(q, k, v, return_lse=True)
        assert torch.equal(got, eager[:total]), (seed, step)
        assert torch.equal(got_lse, eager_lse[:total]), (seed, step)
        testing.check(p, got, got_lse, label=f"[seed {seed} step {step}]")


def test_unused_slots_hold_an_earlier_calls_rows():
    """A plan run first with every request long (each takes many splits and fills its slots),
    then, its kv_len rewritten in place, with two of them short: their rows use the first slots
    only, and the later ones, still holding the first call's rows, are never merged in."""
    seed = new_seed()
    p = testing.make_problem([16, 16, 16], [5000, 5000, 5000], model=GQA128, layout="paged", page_size=1,
                             tree="random", poison=False, seed=seed, device=DEV)
    with testing.kernel_path(testing.KernelPath(config=testing.ROLES_GQA[128], balance_splits=True)):
        pl = testing.plan(p)
        assert pl.info(p.q, p.k, p.v)["split_units"] > 0
        out, lse = testing.run_plan(pl, p, return_lse=True)
        testing.check(p, out, lse, label=f"[seed {seed}] all long")
        kv_lens = [100 + 16, 5000 + 16, 40 + 16]
        p.kv_len.copy_(torch.tensor(kv_lens, dtype=torch.int32))
        p = p.replace(kv_lens=kv_lens)
        out, lse = testing.run_plan(pl, p, return_lse=True)
        testing.check(p, out, lse, label=f"[seed {seed}] one long")


@pytest.mark.parametrize("bad", ["page_id", "kv_short"])
def test_bad_request_in_a_balanced_batch(bad, clean_errors):
    seed = new_seed()
    tag = testing.ROLES_GQA[128]
    p = testing.make_problem([16, 12, 9], [200, 4000, 700], model=GQA128, layout="paged", page_size=1,
                             tree="random", poison=False, seed=seed, device=DEV)
    ref = testing.reference(p)[0]
    q, bit = testing.bad_request(p, bad, kv_row=2000)
    with testing.kernel_path(testing.KernelPath(config=tag, balance_splits=True)):
        assert testing.plan_info(q)["split_units"] > 0
        out, _ = testing.run(q)
    testing.check_bad_request(p, out, ref, bit, label=f"[seed {seed}] {bad}")
