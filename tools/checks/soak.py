#!/usr/bin/env python3
"""Soak test on a GPU: many launches with random shapes, trees and page layouts.

    python3 tools/checks/soak.py [--launches 10000] [--check_rate 0.02] [--seed N] [--json PATH]

Every iteration draws a fresh configuration: model (MLA with H 16..128, GQA
with head_dim 64/128/256 and group 1..8), dtype (bf16/fp16), batch 1..8 with
ragged q_len (1..64, now and then up to 300) and prefix (0..6000), tree (every
kind of ``testing.random_parents`` but ``shuffled``, or causal mode), layout
(flat, or paged with page size 1/16/64/random, scattered / contiguous / shared
prefix pages, 4-D or 3-D cache, spare pages), splits (auto / forced), host
bounds passed or computed, LSE or not, preallocated output or not. About one
iteration in 25 is captured into a CUDA graph instead and replayed 5 to 20
times, with fresh q values copied into the captured input between replays.
Each launch (eager call or graph replay) counts as one.

A sample (``--check_rate``, plus the last replay of every graph) is compared
with the float64 reference (rel. error < 1e-2, LSE within 1e-2);
``verify_attn.check_errors()`` must stay clean (inputs are valid) and is read
every 200 launches. Memory: ``torch.cuda.memory_allocated()`` and the driver's
free memory (``cudaMemGetInfo``, after ``empty_cache``) after a warm-up and at
the end; any growth of allocated memory is a failure (a leak per launch would
show up as a multiple of the launch count), the driver's free memory may move
by less than 64 MiB (allocator segments).

Exit status 0 on pass, 1 on failure, 2 without a GPU. Last line: the summary.
"""

import argparse
import gc
import json
import math
import random
import sys
import time

import torch

import verify_attn
from verify_attn import masks, reference, testing

TREE_KINDS = ("chain", "star", "deep", "random", "ddtree", "eagle")
REL_TOL = 1e-2
LSE_ATOL = 1e-2
DRIVER_SLACK = 64 << 20


def draw(rng):
    c = {}
    if rng.random() < 0.45:
        c.update(mla=True, H=rng.choice([16, 32, 64, 128]), Hkv=1, dqk=576, dvo=512)
    else:
        d = rng.choice([64, 128, 256])
        hkv = rng.choice([1, 2, 4, 8])
        c.update(mla=False, Hkv=hkv, H=hkv * rng.choice([1, 2, 3, 4, 8]), dqk=d, dvo=d)
    c["dtype"] = rng.choice([torch.bfloat16, torch.float16])
    B = rng.choice([1, 1, 2, 3, 4, 8])
    big_q = rng.random() < 0.05
    c["q_lens"] = [rng.randint(1, 300) if big_q else rng.randint(1, 64) for _ in range(B)]
    if B > 1 and rng.random() < 0.1:
        c["q_lens"][rng.randrange(B)] = 0  # an empty request
    cap = 6000 if c["H"] * max(c["q_lens"]) <= 4096 else 1500
    c["prefix"] = [rng.choice([0, rng.randint(1, 64), rng.randint(1, cap)]) for _ in range(B)]
    c["causal"] = rng.random() < 0.15
    c["tree"] = "chain" if c["causal"] else rng.choice(TREE_KINDS)
    c["paged"] = rng.random() < 0.7
    c["page_size"] = rng.choice([1, 1, 16, 64, rng.randint(2, 128)]) if c["paged"] else 1
    c["page_order"] = rng.choice(["scattered", "scattered", "contiguous", "shared"])
    c["cache3d"] = c["paged"] and rng.random() < 0.2
    c["num_splits"] = rng.choice([0, 0, 0, 1, 2, 3, 7])
    c["bounds"] = rng.choice(["exact", "exact", "loose", "computed"])
    c["lse"] = rng.random() < 0.5
    c["prealloc"] = rng.random() < 0.5
    return c


def build(c, rng, dev):
    dt = c["dtype"]
    q_lens, prefix = c["q_lens"], c["prefix"]
    kv_lens = [p + q for p, q in zip(prefix, q_lens)]
    B = len(q_lens)
    qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32, device=dev)
    total_q = int(sum(q_lens))
    q = torch.randn(total_q, c["H"], c["dqk"], device=dev, dtype=dt)
    tree = None
    if not c["causal"]:
        parents = []
        for ql in q_lens:
            parents += testing.random_parents(c["tree"], ql, rng=rng) if ql else []
        tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32, device=dev), qo)
    a = dict(q=q, qo_indptr=qo, tree_mask=tree, causal=c["causal"])
    if not c["paged"]:
        kvp = torch.tensor([0] + list(torch.tensor(kv_lens).cumsum(0).tolist()), dtype=torch.int32, device=dev)
        rows = max(1, int(sum(kv_lens)))
        a.update(k=torch.randn(rows, c["Hkv"], c["dqk"], device=dev, dtype=dt),
                 v=None if c["mla"] else torch.randn(rows, c["Hkv"], c["dvo"], device=dev, dtype=dt),
                 kv_indptr=kvp)
    else:
        ps = c["page_size"]
        pages = [(n + ps - 1) // ps for n in kv_lens]
        order = c["page_order"]
        if order == "shared" and B > 1:
            # every request starts with the same pages (a shared system prompt),
            # then its own: full pages of the shared prefix only
            shared = min(p // ps for p in prefix)
            own = [n - shared for n in pages]
            num_pages = shared + sum(own) + rng.randint(0, 8)
            perm = torch.randperm(num_pages, device=dev).to(torch.int32)
            common, rest, idx = perm[:shared], perm[shared:], []
            off = 0
            for o in own:
                idx.append(torch.cat([common, rest[off:off + o]]))
                off += o
            kv_indices = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.int32, device=dev)
        else:
            num_pages = sum(pages) + rng.randint(0, 8)
            if order == "contiguous":
                kv_indices = torch.arange(sum(pages), dtype=torch.int32, device=dev)
            else:
                kv_indices = torch.randperm(num_pages, device=dev)[: sum(pages)].to(torch.int32)
        num_pages = max(1, num_pages)
        kvp = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32, device=dev)
        kshape = (num_pages * ps, c["Hkv"]) if c["cache3d"] else (num_pages, ps, c["Hkv"])
        a.update(k=torch.randn(*kshape, c["dqk"], device=dev, dtype=dt),
                 v=None if c["mla"] else torch.randn(*kshape, c["dvo"], device=dev, dtype=dt),
                 kv_indptr=kvp, kv_indices=kv_indices,
                 kv_len=torch.tensor(kv_lens, dtype=torch.int32, device=dev))
        if c["cache3d"]:
            a["page_size"] = ps
    kw = dict(num_splits=c["num_splits"], return_lse=c["lse"])
    if c["bounds"] != "computed":
        slack = c["bounds"] == "loose"
        mq = min(1024, max(q_lens) + (rng.randint(0, 16) if slack else 0))
        if tree is not None:
            mq = min(mq, 32 * tree.shape[1])  # a loose bound must still fit the mask's words
        kw["max_q_len"] = mq
        kw["max_kv_len"] = max(kv_lens) + (rng.randint(0, 1000) if slack else 0)
    if c["mla"]:
        kw["head_dim_vo"] = 512
    if c["prealloc"]:
        kw["out"] = torch.full((total_q, c["H"], c["dvo"]), float("nan"), device=dev, dtype=dt)
        if c["lse"]:
            kw["lse"] = torch.full((total_q, c["H"]), float("nan"), device=dev, dtype=torch.float32)
    return a, kw


def call(c, a, kw):
    if c["paged"]:
        extra = {"page_size": a["page_size"]} if "page_size" in a else {}
        return verify_attn.tree_attention_paged(
            a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
            tree_mask=a["tree_mask"], causal=a["causal"], **extra, **kw)
    return verify_attn.tree_attention_flat(
        a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], tree_mask=a["tree_mask"], causal=a["causal"], **kw)


def ref(c, a):
    vo = {"head_dim_vo": c["dvo"]} if c["mla"] else {}
    if c["paged"]:
        extra = {"page_size": a["page_size"]} if "page_size" in a else {}
        return reference.reference_attention_paged(
            a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
            tree_mask=a["tree_mask"], causal=a["causal"], **extra, **vo)
    return reference.reference_attention_flat(
        a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], tree_mask=a["tree_mask"], causal=a["causal"], **vo)


def compare(c, a, res):
    out, lse = res if c["lse"] else (res, None)
    ro, rl = ref(c, a)
    if out.numel() == 0:
        return 0.0, True
    den = ro.norm().item()
    err = (out.double() - ro).norm().item() / (den if den > 0 else 1.0)
    ok = math.isfinite(err) and err < REL_TOL and bool(torch.isfinite(out).all())
    if lse is not None:
        ok = ok and bool(((lse.double() - rl).abs() <= LSE_ATOL + 1e-3 * rl.abs()).all())
    return err, ok


def short(c):
    return ("%s H%d/%d d%d %s B%d q%s p%s %s %s ps%d %s splits%d bounds=%s" % (
        "mla" if c["mla"] else "gqa", c["H"], c["Hkv"], c["dqk"], str(c["dtype"]).split(".")[-1],
        len(c["q_lens"]), max(c["q_lens"]), max(c["prefix"]), "causal" if c["causal"] else c["tree"],
        "paged" if c["paged"] else "flat", c["page_size"], c["page_order"], c["num_splits"], c["bounds"]))


def mem_state(dev):
    gc.collect()
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(dev)
    return int(torch.cuda.memory_allocated(dev)), int(free), int(total)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launches", type=int, default=10000)
    ap.add_argument("--check_rate", type=float, default=0.02)
    ap.add_argument("--graph_rate", type=float, default=0.04)
    ap.add_argument("--warmup", type=int, default=200, help="launches before the first memory reading")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("soak: no CUDA device")
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    dev = torch.device("cuda", torch.cuda.current_device())
    launches = eager = replays = graphs = checks = fails = 0
    worst = 0.0
    mem0 = None
    failures = []
    t0 = time.time()
    it = 0
    while launches < args.launches:
        it += 1
        if mem0 is None and launches >= args.warmup:
            mem0 = mem_state(dev)
        c = draw(rng)
        a, kw = build(c, rng, dev)
        res = None
        try:
            if rng.random() < args.graph_rate and c["bounds"] != "computed":
                # CUDA graph: preallocated outputs, warm-up on a side stream, capture, replays.
                kw["out"] = torch.empty((a["q"].shape[0], c["H"], c["dvo"]), device=dev, dtype=c["dtype"])
                if c["lse"]:
                    kw["lse"] = torch.empty((a["q"].shape[0], c["H"]), device=dev, dtype=torch.float32)
                side = torch.cuda.Stream(dev)
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    call(c, a, kw)
                torch.cuda.current_stream(dev).wait_stream(side)
                launches += 1
                eager += 1
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    res = call(c, a, kw)
                n = rng.randint(5, 20)
                for _ in range(n):
                    a["q"].copy_(torch.randn_like(a["q"]))
                    g.replay()
                graphs += 1
                replays += n
                launches += n
                err, ok = compare(c, a, res)
                checks += 1
                del g
            else:
                res = call(c, a, kw)
                launches += 1
                eager += 1
                err, ok = (0.0, True)
                if it == 1 or rng.random() < args.check_rate:  # it 1: cuBLAS etc. set up before the memory baseline
                    err, ok = compare(c, a, res)
                    checks += 1
        except Exception as e:  # noqa: BLE001 - reported, counted
            err, ok = float("nan"), False
            failures.append("iteration %d (%s): %s: %s" % (it, short(c), type(e).__name__, e))
        if ok:
            worst = max(worst, err)
        else:
            fails += 1
            if len(failures) < 20 and (not failures or not failures[-1].startswith("iteration %d " % it)):
                failures.append("iteration %d (%s): rel err %.3g" % (it, short(c), err))
        if args.verbose:
            print("%6d %s err %.2e %s" % (launches, short(c), err, "ok" if ok else "FAIL"))
        if it % 200 == 0 or launches >= args.launches:
            try:
                verify_attn.check_errors(dev)
            except verify_attn.KernelInputError as e:
                fails += 1
                failures.append("iteration %d: unexpected device error: %s" % (it, e))
        if it % 500 == 0:
            print("soak: %d launches, %d checked, %d failed, %.0f s" % (launches, checks, fails, time.time() - t0),
                  flush=True)
        res = g = side = None  # nothing of this iteration outlives it (memory drift)
        del a, kw
    if mem0 is None:
        mem0 = mem_state(dev)
    mem1 = mem_state(dev)
    alloc_drift = mem1[0] - mem0[0]
    free_drift = mem0[1] - mem1[1]
    mem_ok = alloc_drift <= 0 and free_drift < DRIVER_SLACK
    if not mem_ok:
        fails += 1
        failures.append("memory drift: allocated %+d bytes, driver free %+d bytes" % (alloc_drift, -free_drift))
    dt = time.time() - t0
    summary = dict(
        seed=seed, launches=launches, eager_launches=eager, graphs=graphs, graph_replays=replays,
        checked=checks, failed=fails, worst_rel_err=worst, seconds=round(dt, 1),
        allocated_before=mem0[0], allocated_after=mem1[0], allocated_drift=alloc_drift,
        driver_free_before=mem0[1], driver_free_after=mem1[1], device=torch.cuda.get_device_name(dev),
        passed=fails == 0, failures=failures,
    )
    for f in failures:
        print("FAIL", f)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    print("soak %s: %d launches (%d eager, %d graph replays of %d graphs), %d checked vs reference "
          "(worst rel err %.2e), %d failed; memory_allocated %d -> %d B (drift %+d), driver free %.1f -> %.1f MiB; "
          "seed %d; %.0f s" % (
              "PASS" if fails == 0 else "FAIL", launches, eager, replays, graphs, checks, worst, fails,
              mem0[0], mem1[0], alloc_drift, mem0[1] / 2**20, mem1[1] / 2**20, seed, dt))
    return 0 if fails == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
