"""A representative subset of the GPU suite, small enough for compute-sanitizer.

Flat and paged, MLA and GQA, split (by request and balanced by KV length) and
unsplit, tree and causal, fp16 and bf16,
fp8 (e4m3) caches (skipped when --config forces a head_dim 64 / 128 GQA
kernel without fp8 instances, as racecheck's one-tile run does);
each checked against the float64 reference (exit status 1 on a mismatch).
Plus a bad-index case (paged, page ids past the end, negative and INT32_MAX in
three requests, split, balanced and unsplit): the run expects
verify_attn.check_errors() to raise KernelInputError naming a poisoned request,
the clean request to stay exact, and (memcheck) no out-of-pool read. Run it
with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so each tensor is its own allocation and
memcheck sees a read past the cache (gpu_run.sh does).
Run by tools/gpu_run.sh under memcheck, racecheck and initcheck:

    compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/checks/sanitize_cases.py

--config TAG[,TAG...] runs every call that a tag serves on that configuration
(verify_attn.Tuning(config=...); a tag serves MLA calls if it starts with
"mla_", head_dim d GQA calls if it starts with "gqa_d<d>_"; the plan chooses
for the others). racecheck runs on the one-tile kernels, the only ones whose
hand-offs it models (gpu_run.sh); --config=gqa_d128_roles_m256n64, the
warp-role GQA kernel with 256 rows per CTA (the plan's from 256 rows per KV
head), runs every head_dim 128 GQA case, the bad-index ones included;
--o_tma=off stores the unsplit output from registers (initcheck does not see
the copy engine's stores).
"""

import argparse
import functools
import random
import sys

import torch

import verify_attn
from verify_attn import masks, reference, testing


def make_case(rng, *, mla, paged, dtype, batch, q_len, prefix, heads, hkv, d, page_size, causal,
              in_order=False, kv_slot_runs=1, fp8=False, balance=None):
    dev = "cuda"
    q_lens = [q_len if i % 2 == 0 else max(1, q_len // 2) for i in range(batch)]
    # balance: request i's prefix (1 + 3 i) x prefix, so balanced splits give the requests unequal counts
    kv_lens = [(prefix * (1 + 3 * i) if balance else prefix + i) + q for i, q in enumerate(q_lens)]
    qo_indptr = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=dev)
    total_q = int(qo_indptr[-1])
    dqk, dvo = (576, 512) if mla else (d, d)
    q = torch.randn(total_q, heads, dqk, device=dev, dtype=dtype)
    parents = []
    for ql in q_lens:
        parents += testing.random_parents("chain" if causal else "random", ql, rng=rng)
    tree = None if causal else masks.from_parents(
        torch.tensor(parents, dtype=torch.int32, device=dev), qo_indptr)
    if not paged:
        kv_indptr = torch.tensor([0] + list(torch.tensor(kv_lens).cumsum(0)), dtype=torch.int32, device=dev)
        rows = int(kv_indptr[-1])
        k = torch.randn(rows, hkv, dqk, device=dev, dtype=dtype)
        v = None if mla else torch.randn(rows, hkv, dvo, device=dev, dtype=dtype)
        args = (q, k, v, qo_indptr, kv_indptr)
        fn, ref = functools.partial(verify_attn.tree_attention_flat, tuning=tuning_for(mla, d, balance)), reference.reference_attention_flat
        kw = {}
    else:
        pages = [(n + page_size - 1) // page_size for n in kv_lens]
        num_pages = sum(pages) + 7
        perm = torch.randperm(num_pages, device=dev)[: sum(pages)].to(torch.int32)
        if in_order:  # consecutive page ids: 64-row tiles of consecutive cache rows (copied by TMA)
            perm = torch.arange(sum(pages), device=dev, dtype=torch.int32) + 3
        kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32, device=dev)
        k = torch.randn(num_pages, page_size, hkv, dqk, device=dev, dtype=dtype)
        v = None if mla else torch.randn(num_pages, page_size, hkv, dvo, device=dev, dtype=dtype)
        kv_len = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
        args = (q, k, v, qo_indptr, kv_indptr, perm, kv_len)
        fn, ref = functools.partial(verify_attn.tree_attention_paged, tuning=tuning_for(mla, d, balance)), reference.reference_attention_paged
        if kv_slot_runs > 1:  # the hint: sm_90 MLA takes the TMA kernel, boxing runs, gathering the rest
            fn = functools.partial(fn, kv_slot_runs=kv_slot_runs)
        kw = {}
    if fp8:  # an e4m3 cache of 8 x the values, scales 1/8 (the GQA warp-role kernels convert it)
        k, v = (k * 8).to(torch.float8_e4m3fn), (v * 8).to(torch.float8_e4m3fn)
        args = (*args[:1], k, v, *args[3:])
        kw.update(k_scale=0.125, v_scale=0.125)
    return fn, ref, args, dict(tree_mask=tree, causal=causal, **kw)


def bad_index_case(rng, *, mla, splits, page_size=None, kv_slot_runs=1, balance=None):
    """Poisoned page ids must not be read; check_errors names one; every poisoned request's
    rows are NaN; request 0 stays exact.

    kv_slot_runs=64 (page_size 1, MLA): slots in runs of 64, so the plan takes the
    rows-map TMA kernel (mla_wgmma_seesaw_tma_rows; asserted unless --config
    forces another, as gpu_run.sh does under racecheck); one
    poisoned id is the first row of a tile (the row a box would start from).
    balance: Tuning.balance_splits, over 8 x longer prefixes (GQA: the warp-role
    kernels share the split CTAs by KV length)."""
    dev = "cuda"
    if page_size is None:
        page_size = 1 if mla else 16
    q_lens, prefix = [6, 5, 4, 7], [90, 60, 130, 40]
    if balance:  # long enough for the automatic split count to split (asserted below)
        prefix = [8 * n for n in prefix]
    kv_lens = [p + q for p, q in zip(prefix, q_lens)]
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(pages) + 3
    H, hkv, dqk, dvo = (16, 1, 576, 512) if mla else (8, 2, 128, 128)
    qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=dev)
    parents = []
    for ql in q_lens:
        parents += testing.random_parents("random", ql, rng=rng)
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32, device=dev), qo)
    kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32, device=dev)
    idx = torch.randperm(num_pages, device=dev)[: sum(pages)].to(torch.int32)
    if kv_slot_runs > 1:  # each request's slots: runs of 64 from shuffled 64-slot pool pages
        runs = [(n + 63) // 64 for n in kv_lens]
        num_pages = (sum(runs) + 3) * 64
        pool = torch.randperm(num_pages // 64, device=dev)[: sum(runs)]
        slots = (pool[:, None] * 64 + torch.arange(64, device=dev)).flatten()
        starts = [0] + torch.tensor(runs).cumsum(0).tolist()
        idx = torch.cat([slots[64 * starts[r]: 64 * starts[r] + n] for r, n in enumerate(kv_lens)]).to(torch.int32)
    k = torch.randn(num_pages, page_size, hkv, dqk, device=dev, dtype=torch.bfloat16)
    v = None if mla else torch.randn(num_pages, page_size, hkv, dvo, device=dev, dtype=torch.bfloat16)
    kv_len = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    q = torch.randn(int(qo[-1]), H, dqk, device=dev, dtype=torch.bfloat16)
    ro, _ = reference.reference_attention_paged(q, k, v, qo, kv_indptr, idx, kv_len, tree_mask=tree)
    bad = idx.clone()
    kvp = kv_indptr.tolist()
    poisoned = {1: num_pages + 5, 2: -3, 3: 2**31 - 1}
    for req, val in poisoned.items():
        pos = (kvp[req + 1] - kvp[req]) // 2
        if kv_slot_runs > 1 and req == 2:
            pos = pos // 64 * 64  # a tile's first row (kv_indptr counts rows here)
        bad[kvp[req] + pos] = val
    hint = {"kv_slot_runs": kv_slot_runs} if kv_slot_runs > 1 else {}
    verify_attn.check_errors()
    tuning = tuning_for(mla, dqk, balance)
    if (hint or balance) and torch.cuda.get_device_capability() == (9, 0) and not tuning.config:
        # What the case is for, on sm_90: the rows-map TMA kernel (the hint), balanced splits (the
        # three-stage warp-role kernel at these 28 rows per KV head; sm_120 plans the one-tile one).
        info = verify_attn.plan_info(q, k, v, qo, kv_indptr, bad, kv_len, tree_mask=tree, max_q_len=max(q_lens),
                                     max_kv_len=max(kv_lens), num_splits=splits, tuning=tuning, **hint)
        why = ("the plan is %s, not the rows-map TMA kernel" % info["name"]
               if hint and not info["name"].endswith("mla_wgmma_seesaw_tma_rows")
               else "the plan does not balance the splits" if balance and info["split_units"] == 0 else None)
        if why:
            print("FAIL bad-index mla=%s page_size=%d kv_slot_runs=%d splits=%d%s: %s" % (
                mla, page_size, kv_slot_runs, splits, " balanced" if balance else "", why))
            return False
    out = verify_attn.tree_attention_paged(q, k, v, qo, kv_indptr, bad, kv_len, tree_mask=tree,
                                           max_q_len=max(q_lens), max_kv_len=max(kv_lens), num_splits=splits,
                                           tuning=tuning, **hint)
    try:
        verify_attn.check_errors()
        flagged, msg = None, "no error raised"
    except verify_attn.KernelInputError as e:
        flagged, msg = e, str(e)
    r = slice(0, q_lens[0])
    err = ((out[r].double() - ro[r]).norm() / ro[r].norm()).item()
    qop = qo.tolist()
    all_nan = all(bool(torch.isnan(out[qop[req]:qop[req + 1]]).all()) for req in poisoned)
    ok = (flagged is not None and flagged.bits & verify_attn.errors.ERR_KV_INDEX
          and flagged.request in poisoned and flagged.value == poisoned[flagged.request]
          and all_nan and err < 1e-2 and bool(torch.isfinite(out[r]).all()))
    if not all_nan:
        msg = "a poisoned request's rows are not all NaN; " + msg
    print("%s bad-index mla=%s page_size=%d kv_slot_runs=%d splits=%d%s: request 0 rel err %.2e; raised: %s" % (
        "ok  " if ok else "FAIL", mla, page_size, kv_slot_runs, splits, " balanced" if balance else "", err,
        msg[:200]))
    return ok


CONFIGS = []
O_TMA = True


def tuning_for(mla, d, balance=None):
    """The Tuning of an MLA call (mla) or a GQA call of head_dim d: the first --config tag serving it;
    balance: Tuning.balance_splits (None: the plan's rule)."""
    prefix = "mla_" if mla else "gqa_d%d_" % d
    tag = next((c for c in CONFIGS if c.startswith(prefix)), "")
    return verify_attn.Tuning(config=tag, o_tma=O_TMA, balance_splits=balance)


def main(argv=None):
    global CONFIGS, O_TMA
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="", help="configuration tags, comma-separated (verify_attn.Tuning.config)")
    ap.add_argument("--o_tma", choices=("on", "off"), default="on",
                    help="off: the unsplit output stored from registers")
    args = ap.parse_args(argv)
    CONFIGS = [c for c in args.config.split(",") if c]
    O_TMA = args.o_tma == "on"
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    cases = [
        dict(mla=True, paged=True, dtype=torch.bfloat16, batch=2, q_len=16, prefix=100, heads=16, hkv=1, d=0, page_size=1, causal=False, splits=0),
        dict(mla=True, paged=False, dtype=torch.float16, batch=1, q_len=8, prefix=300, heads=4, hkv=1, d=0, page_size=1, causal=True, splits=3),
        # page_size 64: the sm_90 TMA kernel (kernels/sm90/mla_seesaw_kernel.cuh)
        dict(mla=True, paged=True, dtype=torch.bfloat16, batch=3, q_len=24, prefix=150, heads=16, hkv=1, d=0, page_size=64, causal=False, splits=2),
        # unsplit: full row tiles' output stored by TMA, a partial tile's from registers
        # (folded rows 160 / 80 and 192 / 96 / 192: both paths in each launch)
        dict(mla=True, paged=True, dtype=torch.bfloat16, batch=2, q_len=10, prefix=200, heads=16, hkv=1, d=0, page_size=1, causal=False, splits=1),
        dict(mla=True, paged=True, dtype=torch.float16, batch=3, q_len=12, prefix=250, heads=16, hkv=1, d=0, page_size=64, causal=False, splits=1),
        # a request's rows in one row tile (q_len 4 / 2 at 16 heads): the TMA kernel with
        # the plan's early release of stage 0's blocks 0-3 (Plan::early_a0_release),
        # unsplit and split, page 64 and the hinted page-1 rows kernel
        dict(mla=True, paged=True, dtype=torch.bfloat16, batch=3, q_len=4, prefix=300, heads=16, hkv=1, d=0, page_size=64, causal=False, splits=0),
        dict(mla=True, paged=True, dtype=torch.bfloat16, batch=3, q_len=4, prefix=300, heads=16, hkv=1, d=0, page_size=64, causal=False, splits=3),
        dict(mla=True, paged=True, dtype=torch.float16, batch=2, q_len=4, prefix=260, heads=16, hkv=1, d=0, page_size=1, causal=False, splits=0, kv_slot_runs=64),
        # page_size 16, pages in order (the cp.async kernel; the flat MLA case above runs the TMA kernel)
        dict(mla=True, paged=True, dtype=torch.bfloat16, batch=2, q_len=20, prefix=400, heads=16, hkv=1, d=0, page_size=16, causal=False, splits=2, in_order=True),
        # page_size 1 with the kv_slot_runs hint: the TMA kernel through the rows map
        # (mla_wgmma_seesaw_tma_rows), consecutive slots boxed, scattered ones gathered
        dict(mla=True, paged=True, dtype=torch.bfloat16, batch=1, q_len=12, prefix=830, heads=16, hkv=1, d=0, page_size=1, causal=False, splits=0, in_order=True, kv_slot_runs=64),
        dict(mla=True, paged=True, dtype=torch.float16, batch=2, q_len=9, prefix=250, heads=16, hkv=1, d=0, page_size=1, causal=False, splits=2, kv_slot_runs=64),
        dict(mla=False, paged=True, dtype=torch.bfloat16, batch=3, q_len=16, prefix=70, heads=12, hkv=4, d=128, page_size=16, causal=False, splits=1),
        dict(mla=False, paged=False, dtype=torch.float16, batch=2, q_len=33, prefix=0, heads=8, hkv=8, d=64, page_size=1, causal=False, splits=2),
        dict(mla=False, paged=True, dtype=torch.bfloat16, batch=1, q_len=4, prefix=200, heads=8, hkv=2, d=256, page_size=64, causal=False, splits=0),
        # above 64 rows per KV head (group x q_len 192 / 96 and 120 / 60): the
        # warp-role GQA kernel, its second row tile partly idle
        dict(mla=False, paged=True, dtype=torch.bfloat16, batch=2, q_len=24, prefix=300, heads=16, hkv=2, d=128, page_size=1, causal=False, splits=2),
        dict(mla=False, paged=False, dtype=torch.float16, batch=2, q_len=20, prefix=150, heads=12, hkv=2, d=64, page_size=1, causal=False, splits=0),
        # above 256 rows per KV head (group 8 x q_len 40 / 20: 320 / 160 rows): several row
        # tiles of either warp-role GQA kernel, the last partly empty
        dict(mla=False, paged=False, dtype=torch.bfloat16, batch=2, q_len=40, prefix=200, heads=16, hkv=2, d=128, page_size=1, causal=True, splits=0),
        # balanced splits (the warp-role GQA kernels, automatic split count): requests of
        # 0.1k to 1.2k KV rows take unequal numbers of split CTAs, merged per request
        dict(mla=False, paged=True, dtype=torch.bfloat16, batch=4, q_len=16, prefix=120, heads=16, hkv=2, d=128, page_size=1, causal=False, splits=0, balance=True),
        dict(mla=False, paged=False, dtype=torch.float16, batch=3, q_len=20, prefix=150, heads=12, hkv=2, d=64, page_size=1, causal=True, splits=0, balance=True),
        # fp8 (e4m3) caches: the load warps convert each row into the stage
        dict(mla=False, paged=True, dtype=torch.bfloat16, batch=2, q_len=24, prefix=300, heads=16, hkv=2, d=128, page_size=1, causal=False, splits=2, fp8=True),
        dict(mla=False, paged=False, dtype=torch.float16, batch=2, q_len=40, prefix=150, heads=16, hkv=2, d=64, page_size=1, causal=True, splits=0, fp8=True),
        # head_dim 256: every thread of the one-tile kernel converts its part of a tile
        dict(mla=False, paged=True, dtype=torch.bfloat16, batch=2, q_len=6, prefix=180, heads=8, hkv=2, d=256, page_size=1, causal=False, splits=2, fp8=True),
    ]
    worst = 0.0
    failed = 0
    n = len(cases)
    for c in cases:
        if c.get("fp8") and c["d"] != 256 and any(t.startswith("gqa_d%d_" % c["d"]) and "_roles_" not in t
                                                  for t in CONFIGS):
            n -= 1
            print("skip fp8 case: --config forces a head_dim %d kernel without fp8 instances" % c["d"])
            continue
        splits = c.pop("splits")
        fn, ref, args, kw = make_case(rng, **c)
        if c.get("balance") and not fn.keywords["tuning"].config:
            units = verify_attn.plan_info(*args, num_splits=splits, tuning=fn.keywords["tuning"], **kw)["split_units"]
            if not units:  # the case would not test what it is for
                failed += 1
                print("FAIL mla=%s paged=%s balanced: the plan does not balance the splits" % (c["mla"], c["paged"]))
                continue
        out, lse = fn(*args, return_lse=True, num_splits=splits, **kw)
        torch.cuda.synchronize()
        ro, rl = ref(*args, **kw)
        err = ((out.double() - ro).norm() / ro.norm()).item()
        lerr = ((lse.double() - rl).abs().max()).item()
        ok = err < 1e-2 and lerr < 1e-2 and torch.isfinite(out).all().item()
        worst = max(worst, err)
        failed += not ok
        print("%s mla=%s paged=%s splits=%d%s%s: rel err %.2e, lse max abs err %.2e" % (
            "ok  " if ok else "FAIL", c["mla"], c["paged"], splits, " fp8" if c.get("fp8") else "",
            " balanced" if c.get("balance") else "", err, lerr))
    bad_cases = [dict(mla=True, splits=0), dict(mla=True, splits=0, page_size=64), dict(mla=False, splits=3),
                 dict(mla=False, splits=1), dict(mla=False, splits=0, balance=True),
                 dict(mla=True, splits=0, kv_slot_runs=64),
                 dict(mla=True, splits=3, kv_slot_runs=64)]
    for c in bad_cases:
        failed += not bad_index_case(rng, **c)
    n += len(bad_cases)
    print("seed %d; worst rel err %.2e; %d passed, %d failed" % (seed, worst, n - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
