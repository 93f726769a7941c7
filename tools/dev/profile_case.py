"""Run one bench shape a few times, for ncu / compute-sanitizer to look at.

    ncu --clock-control none -k regex:attention_kernel -c 1 --section SpeedOfLight \
        python3 tools/dev/profile_case.py --kind=mla --batch=1 --heads=16 --q_len=64 --prefix=32768

--impl=flashmla runs FlashMLA's dense decode instead (the bench's chain baseline:
causal chain of the same shape, page block 64, ``use_legacy=True``), imported
from --flashmla_site (where the staged sgl-flash-mla wheel was installed with
``pip install --no-deps --target``); its kernel is ``flash_fwd_splitkv_mla_kernel``
(tools/dev/ncu_case.sh's kernel filter takes it too).

--layout: ``paged`` (pages of --page_size at random ids), ``runs`` (page_size 1, each
request's slots in runs of --slot_runs from random pool pages, as SGLang's token
slots of a ``--page-size`` pool; passed as the kv_slot_runs hint, or --hint=N
instead: --hint=0 none, --slot_runs=1 --hint=64 fully scattered slots with the
hint, i.e. the rows kernel gathering every tile), ``flat`` (tree_attention_flat
on contiguous rows).
"""

import argparse
import os
import random
import statistics
import sys

import torch

import verify_attn
from verify_attn import masks, testing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="mla", choices=["mla", "gqa"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv_heads", type=int, default=4)
    ap.add_argument("--head_dim", type=int, default=128)
    ap.add_argument("--q_len", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=32768)
    ap.add_argument("--page_size", type=int, default=1)
    ap.add_argument("--layout", default="paged", choices=["paged", "runs", "flat"])
    ap.add_argument("--slot_runs", type=int, default=64)
    ap.add_argument("--hint", type=int, default=None,
                    help="--layout=runs: the kv_slot_runs hint passed (default --slot_runs; 0 or 1: none)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="timed rounds of 10 eager calls; the median round is printed. Eager timing "
                         "includes the Python call's host cost wherever that outlasts the kernels "
                         "(about 0.2-0.5 ms per call on the H200 machine: the small shapes); "
                         "--graph times the device alone")
    ap.add_argument("--graph", action="store_true",
                    help="time CUDA-graph replays (no host cost in the figure); one input set, unlike the "
                         "bench's rotation: L2-warm when the KV fits in L2")
    ap.add_argument("--target_ms", type=float, default=100.0, help="--graph: replay time to measure")
    ap.add_argument("--num_splits", type=int, default=0,
                    help="our kernels' split-K count forced to this (0: the plan's choice)")
    ap.add_argument("--impl", default="verify_attn", choices=["verify_attn", "flashmla"])
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the page ids, the draft trees and the values (torch and random)")
    ap.add_argument("--flashmla_site", default="/tmp/fmla_site")
    ap.add_argument("--config", default="",
                    help="our kernel's configuration tag forced (verify_attn.Tuning.config), e.g. mla_m32n32_s1")
    ap.add_argument("--max_smem_bytes", type=int, default=0,
                    help="plan as if a block had this much shared memory (101376: the sm_120 configuration)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    if a.impl == "flashmla":
        return run_flashmla(a)
    dev, dt = "cuda", torch.bfloat16
    mla = a.kind == "mla"
    hkv = 1 if mla else a.kv_heads
    dqk, dvo = (576, 512) if mla else (a.head_dim, a.head_dim)
    kv = a.prefix + a.q_len
    pages = (kv + a.page_size - 1) // a.page_size
    num_pages = a.batch * pages + 16
    qo = torch.arange(0, a.batch + 1, dtype=torch.int32, device=dev) * a.q_len
    kv_indptr = torch.arange(0, a.batch + 1, dtype=torch.int32, device=dev) * pages
    kv_indices = torch.randperm(num_pages, device=dev)[: a.batch * pages].to(torch.int32)
    kv_len = torch.full((a.batch,), kv, dtype=torch.int32, device=dev)
    hint = {}
    if a.layout == "runs":  # page_size 1: slots in runs of R from random pool pages of R slots
        R = a.slot_runs
        runs = (kv + R - 1) // R
        pool = a.batch * runs + 16
        perm = torch.randperm(pool, device=dev)[: a.batch * runs]
        slots = (perm[:, None] * R + torch.arange(R, device=dev)).view(a.batch, runs * R)[:, :kv]
        a.page_size, num_pages = 1, pool * R
        kv_indptr = torch.arange(0, a.batch + 1, dtype=torch.int32, device=dev) * kv
        kv_indices = slots.flatten().to(torch.int32)
        h = R if a.hint is None else a.hint
        hint = {"kv_slot_runs": h} if h > 1 else {}
    k = torch.randn(num_pages, a.page_size, hkv, dqk, device=dev, dtype=dt)
    v = None if mla else torch.randn(num_pages, a.page_size, hkv, dvo, device=dev, dtype=dt)
    q = torch.randn(a.batch * a.q_len, a.heads, dqk, device=dev, dtype=dt)
    parents = []
    for _ in range(a.batch):
        parents += testing.random_parents("ddtree", a.q_len, rng=rng)
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32, device=dev), qo)
    kw = dict(tree_mask=tree, max_q_len=a.q_len, max_kv_len=kv, num_splits=a.num_splits)
    if a.config or a.max_smem_bytes:
        kw["tuning"] = verify_attn.Tuning(config=a.config, max_smem_bytes=a.max_smem_bytes)
    if a.layout == "flat":
        k = torch.randn(a.batch * kv, hkv, dqk, device=dev, dtype=dt)
        v = None if mla else torch.randn(a.batch * kv, hkv, dvo, device=dev, dtype=dt)
        kv_flat = torch.arange(0, a.batch + 1, dtype=torch.int32, device=dev) * kv
        info = verify_attn.plan_info(q, k, v, qo, kv_flat, **kw)

        def call():
            verify_attn.tree_attention_flat(q, k, v, qo, kv_flat, **kw)
    else:
        info = verify_attn.plan_info(q, k, v, qo, kv_indptr, kv_indices, kv_len, **kw, **hint)

        def call():
            verify_attn.tree_attention_paged(q, k, v, qo, kv_indptr, kv_indices, kv_len, **kw, **hint)
    print(info)
    us = time_rounds(call, a)
    flops = 2 * a.heads * a.q_len * kv * (dqk + dvo) * a.batch
    print("%.1f us per launch (%s), %.1f TFLOP/s" % (us, timing_name(a), flops / us / 1e6))


def timing_name(a):
    if a.graph:
        return "graph replay median, one input set"
    n = max(a.rounds, 1)
    rounds = "median of %d rounds" % n if n > 1 else "one round"
    return "eager, %s; includes host cost where it outlasts the kernels: --graph for device time" % rounds


def time_rounds(call, a):
    """--graph: the bench's CUDA-graph timing (tools/bench/benchlib/timing.py: median replay,
    about --target_ms of replays) of this one input set (the bench rotates several
    when they fit in L2). Else eager launches, CUDA events: the median over
    --rounds of a round's mean (us)."""
    if a.graph:
        bench_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
        if bench_dir not in sys.path:
            sys.path.insert(0, bench_dir)
        from benchlib.timing import time_graph  # tools/bench/benchlib (tools/dev/../bench)

        return time_graph([call], "cuda", warmup=a.iters, target_ms=a.target_ms).median_us
    for _ in range(a.iters):
        call()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(max(a.rounds, 1)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            call()
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end) / 10 * 1e3)
    return statistics.median(rounds)


def run_flashmla(a):
    """FlashMLA's causal chain of the shape (MLA only), timed like ours."""
    if a.kind != "mla":
        raise SystemExit("--impl=flashmla: MLA shapes only (--kind=mla)")
    sys.path.insert(0, a.flashmla_site)
    import flash_mla  # noqa: E402  (the staged wheel, not a dependency of this repo)

    dev, dt = "cuda", torch.bfloat16
    kv = a.prefix + a.q_len
    nb = (kv + 63) // 64
    q = torch.randn(a.batch, a.q_len, a.heads, 576, device=dev, dtype=dt)
    k = torch.randn(a.batch * nb + 8, 64, 1, 576, device=dev, dtype=dt)
    table = torch.randperm(a.batch * nb + 8, device=dev)[: a.batch * nb].to(torch.int32).view(a.batch, nb)
    seqlens = torch.full((a.batch,), kv, device=dev, dtype=torch.int32)
    sched, splits = flash_mla.get_mla_metadata(seqlens, a.q_len * a.heads, 1)

    def call():
        return flash_mla.flash_mla_with_kvcache(q, k, table, seqlens, head_dim_v=512, tile_scheduler_metadata=sched,
                                                num_splits=splits, softmax_scale=576 ** -0.5, causal=True,
                                                use_legacy=True)

    us = time_rounds(call, a)
    flops = 2 * a.heads * a.q_len * kv * (576 + 512) * a.batch
    print("flashmla %.1f us per launch (%s), %.1f TFLOP/s" % (us, timing_name(a), flops / us / 1e6))


if __name__ == "__main__":
    main()
