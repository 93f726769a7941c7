"""Output: tables on stdout (tabulate), JSON, a PNG plot (matplotlib, Agg), progress.

Two tables:

1. median microseconds per implementation (``g`` = CUDA-graph replay, ``e`` =
   eager; a baseline is shown in the mode its speedup uses), with ``FAIL`` /
   ``n/a`` / ``--`` (not run) / ``WRONG`` markers;
2. this project (paged kernel, CUDA graph) against the floor and the
   baselines: TFLOP/s, KV GB/s, fractions of the compute and bandwidth
   ceilings and of the floor, the speedup over each baseline, the max
   relative errors.

FlashMLA (``--baselines=flashmla``, a default) has no tree mask: its time
column (``FlashMLA chain us``) is its dense decode with ``causal=True`` on the
causal chain of every MLA row's shape, tree rows included, and the second
table's ``tree/FMLA-chain`` is that time / our time on the row itself (the
tree on tree rows, the chain on chain rows); ``n/a`` on GQA rows.

With ``--baselines=...,sglang_backend`` the second table also has
``xSGL-backend`` (SGLang's Triton backend's ``forward_extend`` time / our
plugin backend's, target verify, both eager) and ``overhead`` (our plugin
backend's time / our bare paged kernel's, both eager): the integration's cost.

Then every failure's reason, one line each.
"""

import json
import math
import os
import sys
from typing import Dict, List, Optional

COLUMNS = [
    ("ours_paged", "ours paged"),
    ("ours_flat", "ours flat"),
    ("sglang_extend", "SGLang extend"),
    ("sglang_chain", "SGLang chain"),
    ("flex", "Flex"),
    ("flashinfer", "FlashInfer"),
    ("flashmla", "FlashMLA chain us"),
    ("sdpa_flash", "FA2 dense us"),
    ("sglang_backend_ours", "SGL-be ours"),
    ("sglang_backend_triton", "SGL-be Triton"),
    ("torch_ref", "torch ref"),
]
_BASIS_SHORT = {"ours_flat": "flat", "torch_ref": "torch ref"}
BASELINES = [("sglang_extend", "xSGL-ext"), ("sglang_chain", "xSGL-chain"), ("flex", "xFlex"),
             ("flashinfer", "xFI"), ("flashmla", "tree/FMLA-chain"), ("sdpa_flash", "xFA2-dense")]
FLASHMLA_NOTE = ("tree/FMLA-chain = FlashMLA's time (sgl-flash-mla dense bf16 decode, causal=True, page "
                 "block 64) on the causal CHAIN of the row's shape (same batch, heads, q_len, prefix: FlashMLA "
                 "takes no tree mask) / our time on the row itself (its tree on tree rows, its chain on chain "
                 "rows), same timing mode; FlashMLA is checked against the float64 reference of that chain. "
                 "Above 1x our tree verify beats FlashMLA's chain verify of the same size; FlashMLA reads "
                 "64-row pages while ours reads --page_size. n/a: not MLA (or ragged q_len).")
# SGLang's backends themselves (benchlib/baselines/sglang_backend.py): not
# speedups over our kernel, but our backend against Triton's and against our kernel.
BACKEND_OURS, BACKEND_TRITON = "sglang_backend_ours", "sglang_backend_triton"
BACKEND_COLUMNS = ["xSGL-backend", "overhead"]

CONVENTIONS = {
    "time": "median of per-call CUDA-event times (eager) or of CUDA-graph replays / calls per graph (graph)",
    "speedup": "baseline median / this project's median (paged kernel, CUDA-graph replay when it "
               "captured, else eager), both in the same timing mode",
    "kv_bytes": "per request (prefix+q_len)*576*2 (MLA) or (prefix+q_len)*Hkv*(Dqk+Dvo)*2 (GQA), summed",
    "flops": "per request 2*H*q_len*(prefix+q_len)*(Dqk+Dvo), summed",
    "frac_compute": "achieved FLOP/s / measured bf16 matmul FLOP/s",
    "frac_bw": "achieved KV bytes/s / measured device-copy bytes/s (read+written)",
    "frac_floor": "max(flops/matmul rate, kv_bytes/copy rate) / measured time",
    "x_sgl_backend": "SGLang TritonAttnBackend.forward_extend median / our plugin backend's forward_extend "
                     "median (target verify, init_forward_metadata outside the timed call, both eager)",
    "overhead": "our plugin backend's forward_extend median / our bare paged kernel's median (both eager)",
    "tree/FMLA-chain": "FlashMLA dense decode (causal=True) median on the causal chain of the row's shape / "
                       "this project's median on the row itself (tree rows: our tree), same timing mode; "
                       "speedup['flashmla'] in the JSON, with baseline_computes set on tree rows",
    "xFA2-dense": "torch SDPA FLASH backend (FlashAttention-2) median on the dense, unmasked problem of the "
                  "row's shape over a flat KV / this project's median on the row (tree, paged), same timing mode",
    "frac_mma": "achieved FLOP/s / measured register-only mma.sync.m16n8k16 bf16 FLOP/s (bench --sm120 table)",
    "err": "max over checked requests of ||out-ref||_F/||ref||_F vs the float64 reference; "
           "'ref[k/B]+ours': k of B requests referenced, baselines also compared with our output",
}


def _fmt_us(x: Optional[float]) -> str:
    if x is None:
        return "--"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}"


def _fmt_x(x: Optional[float]) -> str:
    if x is None:
        return "--"
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def _fmt_pct(x: Optional[float]) -> str:
    return "--" if x is None else f"{100 * x:.0f}%"


def _fmt_err(x: Optional[float]) -> str:
    if x is None:
        return "--"
    if math.isinf(x):
        return "inf"
    return f"{x:.1e}"


def _absent(r: dict) -> str:
    """Cell of an implementation that did not run: why, in a word or two."""
    if r.get("status") == "skipped":
        return "skip"
    why = str(r.get("reason") or "")
    for key in ("not stageable", "not staged", "unavailable"):
        if why.startswith(key):
            return key
    return "unavail."


def impl_cell(r: Optional[dict], mode: Optional[str] = None) -> str:
    """One implementation's cell in the time table."""
    if not r:
        return "--"
    st = r.get("status")
    if st == "failed":
        return "FAIL"
    if st == "n/a":
        return "n/a"
    if st in ("unavailable", "skipped"):
        return _absent(r)
    g = (r.get("graph") or {}).get("median_us")
    e = (r.get("eager") or {}).get("median_us")
    if mode == "eager" or g is None:
        t, tag = e, "e"
    else:
        t, tag = g, "g"
    cell = f"{_fmt_us(t)}{tag}" if t is not None else "--"
    if st == "wrong":
        cell += " WRONG"
    return cell


def _columns(rows: List[dict]):
    """COLUMNS, with the paged kernel's forced-configuration variants
    (``ours_paged@<tag>``, bench --compare_configs) right after it."""
    variants = sorted({k for row in rows for k in row.get("impls", {}) if k.startswith("ours_paged@")})
    return COLUMNS[:1] + [(k, "@" + k.split("@", 1)[1]) for k in variants] + COLUMNS[1:]


def time_table(rows: List[dict]):
    columns = _columns(rows)
    present = {k for row in rows for k in row.get("impls", {})}
    keep = [i for i, (k, _) in enumerate(columns) if k in present]
    headers = ["shape", "check"] + [columns[i][1] for i in keep]
    body = []
    for row in rows:
        if row.get("error") and not row.get("impls"):
            tag = "skipped" if str(row["error"]).startswith("skipped") else "ERROR"
            body.append([row["shape"], tag] + ["--"] * len(keep))
            continue
        mode = (row.get("basis") or {}).get("mode")
        cells = [row["shape"], row.get("check", "--")]
        for i in keep:
            k = columns[i][0]
            r = row["impls"].get(k)
            if k in ("ours_paged", "ours_flat") or k.startswith("ours_paged@"):
                cells.append(_ours_cell(r, k.split("@", 1)[1] if "@" in k else None))
            else:
                cells.append(impl_cell(r, mode))
        body.append(cells)
    return headers, body


def _ours_cell(r, forced: Optional[str] = None):
    """Our time; for a forced-configuration column (``forced`` = its tag), the
    configuration that really ran when the plan refused the tag (an unknown tag,
    or one that does not serve the row's layout / arch) instead of timing it."""
    if not r or r.get("status") not in ("ok", "wrong"):
        return impl_cell(r)
    g = (r.get("graph") or {}).get("median_us")
    e = (r.get("eager") or {}).get("median_us")
    cell = f"{_fmt_us(g)}g/{_fmt_us(e)}e" if g is not None else f"{_fmt_us(e)}e"
    if r.get("status") == "wrong":
        cell += " WRONG"
    plan = r.get("plan")
    if forced and isinstance(plan, str) and not plan.endswith("_" + forced):
        cell += f" (ran {plan})"
    return cell


def _eager_us(r: Optional[dict]) -> Optional[float]:
    if not r or r.get("status") not in ("ok", "wrong"):
        return None
    return (r.get("eager") or {}).get("median_us")


def integration_ratios(row: dict) -> Optional[dict]:
    """``{"x_sgl_backend", "overhead", ...}`` of one row (None without the SGLang-backend rows).

    ``x_sgl_backend`` = Triton backend / our backend, ``overhead`` = our backend /
    our bare paged kernel, all eager medians; ``wrong`` when an output involved was wrong.
    """
    impls = row.get("impls") or {}
    if BACKEND_OURS not in impls and BACKEND_TRITON not in impls:
        return None
    ours_be, tri_be = _eager_us(impls.get(BACKEND_OURS)), _eager_us(impls.get(BACKEND_TRITON))
    kernel = _eager_us(impls.get("ours_paged"))
    out = {"ours_backend_us": ours_be, "triton_backend_us": tri_be, "ours_kernel_us": kernel,
           "x_sgl_backend": tri_be / ours_be if ours_be and tri_be else None,
           "overhead": ours_be / kernel if ours_be and kernel else None, "mode": "eager"}
    out["wrong"] = sorted(k for k in (BACKEND_OURS, BACKEND_TRITON, "ours_paged")
                          if (impls.get(k) or {}).get("status") == "wrong")
    return out


def _status_cell(r: Optional[dict]) -> str:
    st = (r or {}).get("status")
    if st in ("unavailable", "skipped"):
        return _absent(r)
    return {"failed": "FAIL", "n/a": "n/a"}.get(st, "--")


def _integration_cells(row: dict) -> List[str]:
    impls = row.get("impls") or {}
    x = integration_ratios(row) or {}
    bang = "!" if x.get("wrong") else ""
    if x.get("x_sgl_backend") is not None:
        c1 = _fmt_x(x["x_sgl_backend"]) + bang
    else:
        r = impls.get(BACKEND_OURS) if _eager_us(impls.get(BACKEND_OURS)) is None else impls.get(BACKEND_TRITON)
        c1 = _status_cell(r)
    if x.get("overhead") is not None:
        c2 = _fmt_x(x["overhead"]) + bang
    else:
        c2 = _status_cell(impls.get(BACKEND_OURS) if _eager_us(impls.get(BACKEND_OURS)) is None
                          else impls.get("ours_paged"))
    return [c1, c2]


def _has_backends(rows: List[dict]) -> bool:
    return any(k in (row.get("impls") or {}) for row in rows for k in (BACKEND_OURS, BACKEND_TRITON))


def floor_table(rows: List[dict]):
    with_be = _has_backends(rows)
    headers = ["shape", "bound", "floor us", "ours us", "TFLOP/s", "KV GB/s", "%comp", "%bw", "%floor"]
    headers += [h for _, h in BASELINES] + (BACKEND_COLUMNS if with_be else []) + ["err ours", "err base"]
    body = []
    for row in rows:
        if row.get("error") and not row.get("impls"):
            continue
        m = row.get("ours") or {}
        basis = row.get("basis") or {}
        sp = row.get("speedup") or {}
        bus = ""
        if basis.get("us"):
            bus = _fmt_us(basis["us"]) + (basis.get("mode") or "?")[0]
            if basis.get("impl") != "ours_paged":
                bus += f" ({_BASIS_SHORT.get(basis.get('impl'), basis.get('impl'))})"
        cells = [row["shape"], row.get("bound", "--"), _fmt_us(row.get("floor_us")), bus or "--",
                 "--" if not m else f"{m['tflops']:.1f}", "--" if not m else f"{m['kv_gbps']:.0f}",
                 _fmt_pct(m.get("frac_compute")), _fmt_pct(m.get("frac_bw")), _fmt_pct(m.get("frac_floor"))]
        for k, _ in BASELINES:
            s = sp.get(k)
            if s is None:
                r = row["impls"].get(k) or {}
                st = r.get("status")
                if st in ("unavailable", "skipped"):
                    cells.append(_absent(r))
                else:
                    cells.append({"failed": "FAIL", "n/a": "n/a"}.get(st, "--"))
            else:
                c = _fmt_x(s["x"]) + ("e" if s["mode"] == "eager" and basis.get("mode") == "graph" else "")
                if s.get("baseline_wrong"):
                    c += "!"
                cells.append(c)
        if with_be:
            cells.extend(_integration_cells(row))
        ob = row["impls"].get(basis.get("impl") or "", {}) if basis.get("impl") else {}
        cells.append(_fmt_err(ob.get("err_ref")))
        errs = []
        for k in [k for k, _ in BASELINES] + ([BACKEND_OURS, BACKEND_TRITON] if with_be else []):
            r = row["impls"].get(k) or {}
            for key in ("err_ref", "err_vs_ours"):
                if r.get(key) is not None:
                    errs.append(r[key])
        cells.append(_fmt_err(max(errs) if errs else None))
        body.append(cells)
    return headers, body


SM120 = "ours_paged@sm120"


def _best(r: Optional[dict]):
    """(best_us, best_mode, metrics) of an implementation that ran, else None."""
    if not r or r.get("status") not in ("ok", "wrong") or r.get("best_us") is None:
        return None
    return r["best_us"], r.get("best_mode") or "?", r.get("metrics") or {}


def portable_table(rows: List[dict]):
    """The sm_120 configuration (bench --sm120) against the mma.sync ceiling and
    FlashAttention-2's dense time: one line per row that ran the column."""
    headers = ["shape", "bound", "ours us", "ours %mma", "sm120 config", "sm120 us", "sm120 TFLOP/s",
               "sm120 %mma", "sm120 %floor", "FA2 dense us", "xFA2 ours", "xFA2 sm120"]
    body = []
    for row in rows:
        impls = row.get("impls") or {}
        if SM120 not in impls:
            continue
        ours, sm, fa = _best(impls.get("ours_paged")), _best(impls.get(SM120)), _best(impls.get("sdpa_flash"))
        cfg = impls[SM120].get("plan") if isinstance(impls[SM120].get("plan"), str) else "--"

        def us(b):
            return "--" if b is None else _fmt_us(b[0]) + b[1][0]

        def x(b):
            return _fmt_x(fa[0] / b[0]) if fa and b else "--"

        sm_cell = us(sm) if sm else _status_cell(impls.get(SM120))
        body.append([row["shape"], row.get("bound", "--"), us(ours), _fmt_pct(ours[2].get("frac_mma")) if ours else "--",
                     cfg, sm_cell, f"{sm[2]['tflops']:.1f}" if sm and sm[2] else "--",
                     _fmt_pct(sm[2].get("frac_mma")) if sm else "--", _fmt_pct(sm[2].get("frac_floor")) if sm else "--",
                     us(fa) if fa else _status_cell(impls.get("sdpa_flash")), x(ours), x(sm)])
    return headers, body


def notes(rows: List[dict]) -> List[str]:
    out, seen_unavail = [], set()
    for row in rows:
        if row.get("error"):
            out.append(f"{row['shape']}: {row['error']}")
        for k, r in (row.get("impls") or {}).items():
            st = r.get("status")
            if st == "unavailable":
                if k not in seen_unavail:
                    seen_unavail.add(k)
                    out.append(f"{r.get('label', k)}: {r.get('reason')}")
            elif st in ("failed", "wrong"):
                out.append(f"{row['shape']}: {r.get('label', k)}: {st}: {r.get('reason')}")
            if r.get("graph_error"):
                out.append(f"{row['shape']}: {r.get('label', k)}: CUDA graph: {r['graph_error']}")
    return out


def render(rows: List[dict], header: Dict[str, str]) -> str:
    from tabulate import tabulate

    lines = []
    for k, v in header.items():
        lines.append(f"{k}: {v}")
    lines.append("")
    h, b = time_table(rows)
    lines.append("Median time per call, microseconds (g = CUDA-graph replay, e = eager)")
    lines.append(tabulate(b, headers=h, tablefmt="github", disable_numparse=True))
    lines.append("")
    h, b = floor_table(rows)
    if b:
        lines.append("This project (paged kernel) vs the floor and the baselines "
                     "(xNAME = NAME's time / ours, same timing mode; ! = that baseline's output was wrong)")
        lines.append(tabulate(b, headers=h, tablefmt="github", disable_numparse=True))
        if any("flashmla" in (row.get("impls") or {}) for row in rows):
            lines.append(FLASHMLA_NOTE)
        if _has_backends(rows):
            lines.append("xSGL-backend = SGLang TritonAttnBackend.forward_extend / our plugin backend's "
                         "(target verify, eager); overhead = our plugin backend's forward_extend / our bare "
                         "paged kernel (eager)")
        lines.append("")
    h, b = portable_table(rows)
    if b:
        lines.append("The sm_120 configuration on this card (ours_paged@sm120: planned under 101,376 bytes of "
                     "shared memory per block) against the mma.sync ceiling and torch's FlashAttention-2 on "
                     "the dense unmasked problem (xFA2 = FA2's time / ours; %mma = FLOP/s / mma.sync ceiling)")
        lines.append(tabulate(b, headers=h, tablefmt="github", disable_numparse=True))
        lines.append("")
    for row in rows:
        if row.get("reference_error"):
            lines.append(f"{row['shape']}: float64 reference failed ({row['reference_error']}); "
                         "errors only vs our kernel")
        if row.get("chain_reference_error"):
            lines.append(f"{row['shape']}: float64 reference of its chain failed "
                         f"({row['chain_reference_error']}); FlashMLA's output unchecked")
        if row.get("dense_reference_error"):
            lines.append(f"{row['shape']}: float64 reference of the unmasked problem failed "
                         f"({row['dense_reference_error']}); the dense baseline's output unchecked")
    ns = notes(rows)
    if ns:
        lines.append("Notes:")
        lines.extend("  " + n for n in ns)
    return "\n".join(lines)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        return x
    if isinstance(x, (int, str, bool)) or x is None:
        return x
    return str(x)


def write_json(path: str, payload: dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_jsonable(payload), f, indent=1)
    os.replace(tmp, path)


def plot(rows: List[dict], path: str, title: str = "") -> Optional[str]:
    """Speedup over each baseline and fraction of the floor, per shape. Returns path or None."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("impls")]
    if not rows:
        return None
    names = [r["shape"] for r in rows]
    n = len(names)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(10, 0.45 * n + 3), 10), sharex=True)
    width = 0.8 / len(BASELINES)
    xs = list(range(n))
    any_speed = False
    for j, (k, label) in enumerate(BASELINES):
        ys, xpos = [], []
        for i, r in enumerate(rows):
            s = (r.get("speedup") or {}).get(k)
            if s:
                ys.append(s["x"])
                xpos.append(i - 0.4 + (j + 0.5) * width)
        if ys:
            any_speed = True
            ax1.bar(xpos, ys, width=width, label=label.lstrip("x"))
    ax1.axhline(1.0, color="k", lw=0.8)
    if any_speed:
        ax1.set_yscale("log")
        ax1.legend(fontsize=8, loc="best")
    ax1.set_ylabel("speedup (baseline time / ours)")
    ax1.set_title(title or "verify_attn: speedup over each baseline (same run)")
    fc = [(r.get("ours") or {}).get("frac_compute") for r in rows]
    fb = [(r.get("ours") or {}).get("frac_bw") for r in rows]
    ff = [(r.get("ours") or {}).get("frac_floor") for r in rows]
    w2 = 0.27
    ax2.bar([x - w2 for x in xs], [v or 0 for v in ff], width=w2, label="fraction of floor")
    ax2.bar(xs, [v or 0 for v in fc], width=w2, label="fraction of matmul FLOP/s")
    ax2.bar([x + w2 for x in xs], [v or 0 for v in fb], width=w2, label="fraction of copy bandwidth")
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_ylabel("fraction (ours paged)")
    ax2.legend(fontsize=8, loc="best")
    ax2.set_xticks(xs)
    ax2.set_xticklabels(names, rotation=75, ha="right", fontsize=7)
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class Progress:
    """tqdm progress bar on stderr (plain lines when tqdm is missing)."""

    def __init__(self, total: int, desc: str = "verify_attn bench", enabled: bool = True):
        self.total = total
        self.n = 0
        self.bar = None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, file=sys.stderr, unit="shape",
                                dynamic_ncols=True, mininterval=0.5)
            except Exception:  # noqa: BLE001
                self.bar = None

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)
        elif self.enabled:
            print(f"[{self.n + 1}/{self.total}] {text}", file=sys.stderr, flush=True)

    def advance(self) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
