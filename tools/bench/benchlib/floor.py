"""The floor (DESIGN.md §3) and the ceilings it is measured against.

Per request ``i`` with ``L_i`` prefix tokens and ``T_i`` draft tokens:

- KV bytes: every KV row is read once for all heads and all draft tokens.
  MLA (absorbed; the value is the first 512 values of the same 576-wide row):
  ``(L_i + T_i) * 576 * elem``; GQA: ``(L_i + T_i) * Hkv * (Dqk + Dvo) * elem``
  (K and V; ``elem`` = 2 bytes for bf16/fp16).
- FLOPs: ``2 * H * T_i * (L_i + T_i) * (Dqk + Dvo)`` (QK^T and PV over the full
  ``T x (L + T)`` rectangle, as §3 counts them).

Ceilings, measured in the same run on the same device:

- bandwidth: a large device-to-device copy, counted as bytes read + bytes
  written per second (DESIGN.md §2's 4.27 TB/s on the H200);
- compute: a large dense bf16 matrix product (§2's 686 TFLOP/s);
- mma.sync (optional): register-only ``mma.sync.m16n8k16`` bf16 -> fp32, the
  most a kernel built from mma.sync alone reaches (the portable kernels, all
  sm_120 has): :func:`measure_mma_sync` runs ``tools/bench/ceilings/mma_peak``;
  ``frac_mma = (flops / t) / mma rate``.

For a measured time ``t``: ``TFLOP/s = flops / t``, ``KV GB/s = kv_bytes / t``,
``frac_compute = (flops / t) / peak``, ``frac_bw = (kv_bytes / t) / bw``, and
the floor ``t_floor = max(flops / peak, kv_bytes / bw)``, ``frac_floor =
t_floor / t`` (1.0 = at the roofline; the larger of the two fractions).
"""

import dataclasses
import statistics
import time
from typing import Optional

# DESIGN.md §2, measured on an H200; used only when nothing was measured (dry run).
NOMINAL_H200_COPY_BYTES_PER_S = 4.27e12
NOMINAL_H200_MATMUL_FLOP_PER_S = 686e12


@dataclasses.dataclass
class Ceilings:
    copy_bytes_per_s: float     # bytes read + written per second
    matmul_flop_per_s: float
    device: str
    measured: bool
    note: str = ""
    # register-only mma.sync.m16n8k16 bf16 rate (tools/bench/ceilings/mma_peak.cu):
    # the ceiling of the mma.sync kernels (sm_120's only tensor-core path); None: not measured
    mma_sync_flop_per_s: Optional[float] = None

    def as_dict(self):
        return dataclasses.asdict(self)


def _elem_bytes(dtype: str) -> int:
    return {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]


def kv_row_bytes(shape) -> int:
    """Bytes of one KV token row (all KV heads, K and V)."""
    e = _elem_bytes(shape.dtype)
    if shape.mla:
        return shape.d_qk * e
    return shape.kv_heads * (shape.d_qk + shape.d_vo) * e


def kv_bytes(shape) -> int:
    row = kv_row_bytes(shape)
    return sum((l + t) * row for l, t in zip(shape.request_prefix_lens(), shape.request_q_lens()))


def flops(shape) -> int:
    d = shape.d_qk + shape.d_vo
    return sum(
        2 * shape.heads * t * (l + t) * d
        for l, t in zip(shape.request_prefix_lens(), shape.request_q_lens())
    )


def arithmetic_intensity(shape) -> float:
    b = kv_bytes(shape)
    return flops(shape) / b if b else 0.0


def floor_seconds(shape, ceil: Ceilings) -> float:
    return max(flops(shape) / ceil.matmul_flop_per_s, kv_bytes(shape) / ceil.copy_bytes_per_s)


def bound(shape, ceil: Ceilings) -> str:
    """'compute' or 'bandwidth': which side of the ridge the shape sits on."""
    tc = flops(shape) / ceil.matmul_flop_per_s
    tb = kv_bytes(shape) / ceil.copy_bytes_per_s
    return "compute" if tc >= tb else "bandwidth"


def metrics(shape, seconds: Optional[float], ceil: Ceilings) -> dict:
    """Throughputs and fractions of the floor for one measured time (None -> empty)."""
    if not seconds or seconds <= 0:
        return {}
    f, b = flops(shape), kv_bytes(shape)
    fl = floor_seconds(shape, ceil)
    return {
        "tflops": f / seconds / 1e12,
        "kv_gbps": b / seconds / 1e9,
        "frac_compute": (f / seconds) / ceil.matmul_flop_per_s,
        "frac_bw": (b / seconds) / ceil.copy_bytes_per_s,
        "frac_floor": fl / seconds,
        "floor_us": fl * 1e6,
        "frac_mma": (f / seconds) / ceil.mma_sync_flop_per_s if ceil.mma_sync_flop_per_s else None,
    }


def nominal_ceilings(note: str = "nominal H200 figures from DESIGN.md §2 (not measured)") -> Ceilings:
    return Ceilings(NOMINAL_H200_COPY_BYTES_PER_S, NOMINAL_H200_MATMUL_FLOP_PER_S,
                    device="(none)", measured=False, note=note)


def measure_ceilings(device=None, copy_bytes: int = 2 << 30, mm_n: int = 8192,
                     iters: int = 20) -> Ceilings:
    """Measure the copy bandwidth and the bf16 matmul rate on ``device`` (CUDA)."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda")
    free = torch.cuda.mem_get_info(dev)[0]
    nbytes = int(min(copy_bytes, free // 8))
    nbytes -= nbytes % 16
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)

    def med(fn, n):
        for _ in range(3):
            fn()
        torch.cuda.synchronize(dev)
        ts = []
        for _ in range(n):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        return statistics.median(ts)

    t_copy = med(lambda: dst.copy_(src), iters)
    copy_rate = 2 * nbytes / t_copy
    del src, dst
    a = torch.randn(mm_n, mm_n, dtype=torch.bfloat16, device=dev)
    b = torch.randn(mm_n, mm_n, dtype=torch.bfloat16, device=dev)
    c = torch.empty(mm_n, mm_n, dtype=torch.bfloat16, device=dev)
    t_mm = med(lambda: torch.matmul(a, b, out=c), iters)
    mm_rate = 2 * mm_n ** 3 / t_mm
    del a, b, c
    torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(dev)
    return Ceilings(copy_rate, mm_rate, device=name, measured=True,
                    note=f"copy of {nbytes / 2**30:.2f} GiB (read+write), bf16 matmul {mm_n}^3, "
                         f"median of {iters}, {time.strftime('%Y-%m-%d %H:%M:%S')}")


def measure_mma_sync(binary: str, timeout_s: float = 120.0):
    """Run the mma.sync ceiling binary (``tools/bench/ceilings:mma_peak``): ``(flop_per_s, None)``
    or ``(None, reason)``; never raises."""
    import json
    import os
    import subprocess

    if not binary or not os.path.isfile(binary):
        return None, f"no mma.sync ceiling binary at {binary!r} (tools/gpu_run.sh stage builds .gpu_stage/mma_peak)"
    try:
        r = subprocess.run([binary], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{binary}: {type(e).__name__}: {e}"
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"{binary} exited {r.returncode}: {tail[0]}"
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
        return float(out["mma_sync_tflops"]) * 1e12, None
    except (ValueError, KeyError, IndexError) as e:
        return None, f"{binary}: unreadable output ({type(e).__name__})"
