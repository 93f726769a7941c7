"""Timing: CUDA events and medians, CUDA-graph replay, rotation over input sets.

Rules (the issue's standards):

- warm up first (Triton/Inductor compile, allocator, first-touch);
- eager: each timed call is bracketed by its own pair of CUDA events; the
  result is the median over calls;
- graph: the calls over every input set are captured once in one CUDA graph
  (after a warm-up on a side stream, as torch's docs require), then the graph
  is replayed between events; per-call time = replay time / number of calls;
  median over replays;
- rotation: when the inputs are small enough to stay in the 60 MB L2 between
  calls, several independent input sets are made (:func:`rotation_sets`) and
  the calls cycle through them, so no call finds its KV in L2 from the last one;
- the number of timed calls adapts to the call's length (``target_ms`` of timed
  work, clamped to ``[min_iters, max_iters]``).

On CPU (``--dry_run``) the same functions time with ``time.perf_counter``.
"""

import dataclasses
import math
import statistics
import time
from typing import Callable, Sequence

L2_BYTES = 60 * 1024 * 1024   # H200: 60 MB (50 MB on H100)
MAX_SETS = 8


@dataclasses.dataclass
class Timing:
    mode: str                  # "eager" or "graph"
    median_us: float
    p10_us: float
    p90_us: float
    iters: int
    sets: int

    def as_dict(self):
        return dataclasses.asdict(self)


def rotation_sets(working_set_bytes: int, l2_bytes: int = L2_BYTES, max_sets: int = MAX_SETS) -> int:
    """How many independent input sets to rotate among.

    Enough that the bytes touched between two uses of one set exceed twice the
    L2 (1 when one set is already that large), at most ``max_sets``.
    """
    if working_set_bytes <= 0:
        return max_sets
    return int(max(1, min(max_sets, math.ceil(2 * l2_bytes / working_set_bytes))))


def _quantiles(ts_s: Sequence[float]):
    ts = sorted(ts_s)
    n = len(ts)

    def q(p):
        if n == 1:
            return ts[0]
        x = p * (n - 1)
        lo = int(math.floor(x))
        hi = min(n - 1, lo + 1)
        return ts[lo] + (ts[hi] - ts[lo]) * (x - lo)

    return statistics.median(ts), q(0.1), q(0.9)


def _iters_for(est_s: float, target_ms: float, min_iters: int, max_iters: int) -> int:
    if est_s <= 0:
        return max_iters
    return int(max(min_iters, min(max_iters, round(target_ms / 1e3 / est_s))))


def _is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def time_eager(fns: Sequence[Callable[[], object]], device, *, warmup: int = 3,
               target_ms: float = 150.0, min_iters: int = 5, max_iters: int = 200) -> Timing:
    """Median time of one call, cycling through ``fns`` (one per input set)."""
    n = len(fns)
    if _is_cuda(device):
        import torch

        for i in range(max(warmup, 1) * n):
            fns[i % n]()
        torch.cuda.synchronize(device)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for f in fns:
            f()
        b.record()
        b.synchronize()
        est = a.elapsed_time(b) / 1e3 / n
        iters = _iters_for(est, target_ms, min_iters, max_iters)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            fns[i % n]()
            ends[i].record()
        torch.cuda.synchronize(device)
        ts = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    else:
        for i in range(max(warmup, 1) * n):
            fns[i % n]()
        t0 = time.perf_counter()
        for f in fns:
            f()
        est = (time.perf_counter() - t0) / n
        iters = _iters_for(est, target_ms, min_iters, max_iters)
        ts = []
        for i in range(iters):
            t0 = time.perf_counter()
            fns[i % n]()
            ts.append(time.perf_counter() - t0)
    med, p10, p90 = _quantiles(ts)
    return Timing("eager", med * 1e6, p10 * 1e6, p90 * 1e6, len(ts), n)


def time_graph(fns: Sequence[Callable[[], object]], device, *, warmup: int = 3,
               target_ms: float = 150.0, min_iters: int = 5, max_iters: int = 200) -> Timing:
    """Capture one call per input set into one CUDA graph; median replay time / calls.

    Raises whatever capture raises (the caller reports it as the graph column's failure).
    """
    import torch

    if not _is_cuda(device):
        raise RuntimeError("CUDA graphs need a CUDA device")
    n = len(fns)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for i in range(max(warmup, 1) * n):
            fns[i % n]()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            for f in fns:
                f()
        g.replay()
        torch.cuda.synchronize(device)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        est = a.elapsed_time(b) / 1e3
        iters = _iters_for(est, target_ms, min_iters, max_iters)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            g.replay()
            ends[i].record()
        torch.cuda.synchronize(device)
        ts = [s.elapsed_time(e) / 1e3 / n for s, e in zip(starts, ends)]
    finally:
        del g
    med, p10, p90 = _quantiles(ts)
    return Timing("graph", med * 1e6, p10 * 1e6, p90 * 1e6, len(ts), n)


def synchronize(device) -> None:
    if _is_cuda(device):
        import torch

        torch.cuda.synchronize(device)
