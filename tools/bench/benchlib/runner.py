"""One shape through every implementation: build, verify, time. Never raises.

For each shape, in one process and one run:

1. build the case (random trees, scattered page table) and the input sets
   (several when one set would sit in L2: see :func:`benchlib.timing.rotation_sets`);
2. the float64 reference over all requests, or a subsample for big shapes
   (:mod:`benchlib.check`);
3. for every implementation (ours paged first: the others are also compared
   with its output): prepare, run once, check the output, then time it eagerly
   and as a CUDA-graph replay; an implementation that computes the causal
   CHAIN of the shape whatever its tree (``computes = "chain"``: FlashMLA) is
   checked on a tree row against the float64 reference of that chain, and a
   dense kernel (``computes = "dense"``: torch's FlashAttention-2) against the
   reference of the unmasked problem (each built once per row when needed), not
   against the tree reference nor our output;
4. with ``rounds`` > 1, every implementation that ran is timed again, round
   after round, in reversed order every other round (:func:`retime_rounds`), and
   each mode keeps the median over rounds: the H200's clock drifts with power
   and temperature over seconds (1,980 MHz idle, ~1,875 MHz and a power-cap
   throttle reason under this load), so one pass in list order can favour
   whichever implementation runs first;
5. the row: medians, the basis (ours paged under graph replay when it ran),
   throughputs and fractions of the floor (:mod:`benchlib.floor`), and the
   speedup over every baseline measured in the same timing mode.

Every failure (of a baseline, a graph capture, a shape too big for memory) is
caught and written into the row.
"""

import dataclasses
import gc
import statistics
import time
import traceback
from typing import Dict, List, Optional, Sequence

from . import check, floor, inputs as inputs_mod, timing
from .baselines import Impl, NotApplicable, short_reason

BASIS_ORDER = ("ours_paged", "ours_flat", "torch_ref")


@dataclasses.dataclass
class Options:
    device: str = "cuda"
    page_size: int = 1
    slot_runs: int = 1          # page_size 1: slots in runs of this many (inputs.build_case)
    kv_slot_runs_hint: Optional[int] = None  # verify_attn's hint; None: slot_runs (inputs.build_case)
    seed: int = 0
    graph: bool = True
    rotate: bool = True
    warmup: int = 3
    target_ms: float = 150.0
    min_iters: int = 5
    max_iters: int = 200
    flex_policy: str = "auto"
    grid_name: str = "quick"
    mem_fraction: float = 0.7   # of free device memory the input sets may take
    rounds: int = 1             # timing rounds per shape (retime_rounds)


def _shape_info(shape, page_size) -> dict:
    return {
        "shape": shape.name, "model": shape.model, "batch": len(shape.request_q_lens()),
        "heads": shape.heads, "kv_heads": shape.kv_heads, "d_qk": shape.d_qk, "d_vo": shape.d_vo,
        "q_len": max(shape.request_q_lens()) if shape.request_q_lens() else 0,
        "prefix": max(shape.request_prefix_lens()) if shape.request_prefix_lens() else 0,
        "tree": shape.tree, "tags": list(shape.tags), "dtype": shape.dtype, "page_size": page_size,
        "ragged": shape.q_lens is not None or shape.prefix_lens is not None,
    }


def _free_bytes(device) -> Optional[int]:
    if str(device).startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return None


def _empty_cache(device):
    gc.collect()
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def computes_chain_of_tree(impl: Impl, shape) -> bool:
    """True when ``impl`` computes the causal chain of ``shape`` while the row is a tree."""
    return getattr(impl, "computes", "tree") == "chain" and not shape.is_chain


def other_problem(impl: Impl, shape) -> Optional[str]:
    """The problem ``impl`` computes when it is not the row's own: ``"chain"`` (the causal
    chain of a tree row's shape, FlashMLA) or ``"dense"`` (the unmasked problem of the
    shape, a dense attention kernel); None when it computes the row itself."""
    if computes_chain_of_tree(impl, shape):
        return "chain"
    if getattr(impl, "computes", "tree") == "dense":
        return "dense"
    return None


def _timing_kwargs(opts: Options) -> dict:
    """The keyword arguments of timing.time_eager / time_graph from the options."""
    return dict(warmup=opts.warmup, target_ms=opts.target_ms, min_iters=opts.min_iters,
                max_iters=opts.max_iters)


def run_impl(impl: Impl, case, sets, ref, ours_out, opts: Options, device) -> dict:
    res = {"label": impl.label, "status": "ok", "reason": None, "eager": None, "graph": None,
           "graph_error": None, "err_ref": None, "err_vs_ours": None}
    why = impl.applies(case)
    if why:
        res.update(status="n/a", reason=why)
        return res
    if getattr(impl, "computes", "tree") in ("chain", "dense"):
        res["computes"] = impl.computes
    try:
        fns = [impl.prepare(case, s) for s in sets]
        out = fns[0]()
        timing.synchronize(device)
        out = out.detach().clone()
        res["err_ref"] = check.err_vs_reference(out, case, ref)
        if impl.check_vs_ours and ours_out is not None:
            res["err_vs_ours"] = check.err_vs(out, ours_out)
        res["_out"] = out
    except NotApplicable as e:
        res.update(status="n/a", reason=str(e))
        return res
    except Exception as e:  # noqa: BLE001
        res.update(status="failed", reason=short_reason(e), traceback=traceback.format_exc(limit=4))
        return res
    errs = [x for x in (res["err_ref"], res["err_vs_ours"]) if x is not None]
    tol = getattr(impl, "tol", check.TOL)  # a quantized cache's column: its own bound
    if errs and max(errs) > tol:
        res["status"] = "wrong"
        res["reason"] = f"max relative error {max(errs):.2e} > {tol:.0e}"
    tkw = _timing_kwargs(opts)
    try:
        res["eager"] = timing.time_eager(fns, device, **tkw).as_dict()
    except Exception as e:  # noqa: BLE001
        res.update(status="failed", reason=f"eager timing: {short_reason(e)}")
        return res
    if opts.graph and impl.graphable and str(device).startswith("cuda"):
        try:
            res["graph"] = timing.time_graph(fns, device, **tkw).as_dict()
        except Exception as e:  # noqa: BLE001
            res["graph_error"] = short_reason(e)
            try:
                timing.synchronize(device)
            except Exception:  # noqa: BLE001
                pass
    return res


def retime_rounds(row: dict, impls: Sequence[Impl], case, sets, opts: Options, device) -> None:
    """Rounds 2 .. ``opts.rounds`` of the timing of one shape.

    Round 1 is the pass of :func:`run_shape` (list order, with the checks); each
    further round prepares every implementation that ran (status ok or wrong)
    again and times the modes it was timed in, in reversed order every other
    round, so a slow clock drift falls on every implementation alike. Each
    mode's ``median_us`` becomes the median over rounds (the per-round medians
    are kept in ``rounds_us``); a failing round is recorded in ``rounds_error``
    and leaves the rounds before it.
    """
    timed = [i for i in impls if row["impls"].get(i.name, {}).get("status") in ("ok", "wrong")]
    tkw = _timing_kwargs(opts)
    for res in (row["impls"][i.name] for i in timed):
        for mode in ("eager", "graph"):
            if res.get(mode):
                res[mode]["rounds_us"] = [res[mode]["median_us"]]
    for r in range(1, max(1, opts.rounds)):
        for impl in (timed[::-1] if r % 2 else timed):
            res = row["impls"][impl.name]
            if res.get("rounds_error"):
                continue
            try:
                fns = [impl.prepare(case, s) for s in sets]
                res["eager"]["rounds_us"].append(timing.time_eager(fns, device, **tkw).median_us)
                if res.get("graph"):
                    res["graph"]["rounds_us"].append(timing.time_graph(fns, device, **tkw).median_us)
            except Exception as e:  # noqa: BLE001
                res["rounds_error"] = f"round {r + 1}: {short_reason(e)}"
                try:
                    timing.synchronize(device)
                except Exception:  # noqa: BLE001
                    pass
            finally:
                try:
                    impl.release()
                except Exception:  # noqa: BLE001
                    pass
    for res in (row["impls"][i.name] for i in timed):
        for mode in ("eager", "graph"):
            if res.get(mode) and res[mode].get("rounds_us"):
                res[mode]["median_us"] = statistics.median(res[mode]["rounds_us"])


def _time_of(res: dict, mode: str) -> Optional[float]:
    t = res.get(mode) if res else None
    return t["median_us"] if t else None


def summarize(row: dict, shape, ceil: floor.Ceilings) -> None:
    """Fill basis, throughputs, floor fractions and speedups into ``row`` (pure)."""
    impls = row["impls"]
    basis, mode, t_basis = None, None, None
    for name in BASIS_ORDER:
        r = impls.get(name)
        if not r or r["status"] not in ("ok",):
            continue
        for m in ("graph", "eager"):
            t = _time_of(r, m)
            if t:
                basis, mode, t_basis = name, m, t
                break
        if basis:
            break
    row["basis"] = {"impl": basis, "mode": mode, "us": t_basis}
    row["ours"] = floor.metrics(shape, t_basis / 1e6 if t_basis else None, ceil)
    for name, r in impls.items():
        best_mode, best = None, None
        for m in ("graph", "eager"):
            t = _time_of(r, m)
            if t:
                best_mode, best = m, t
                break
        r["best_us"], r["best_mode"] = best, best_mode
        r["metrics"] = floor.metrics(shape, best / 1e6 if best else None, ceil)
    speed = {}
    for name, r in impls.items():
        if not r.get("competitor", True) or t_basis is None:
            continue
        tb = _time_of(r, mode)
        m = mode
        if tb is None and mode == "graph":
            # baseline could not be captured: compare eager with eager
            tb = _time_of(r, "eager")
            m = "eager"
            t_ours = _time_of(impls[basis], "eager")
        else:
            t_ours = t_basis
        if tb and t_ours:
            speed[name] = {"x": tb / t_ours, "mode": m, "baseline_wrong": r["status"] == "wrong"}
            if r.get("computes") == "chain" and not shape.is_chain:
                # FlashMLA: its time on the causal chain of this shape / ours on the tree
                speed[name]["baseline_computes"] = "causal chain of the same shape"
            elif r.get("computes") == "dense":
                # a dense kernel: its time on the unmasked problem of this shape / ours
                speed[name]["baseline_computes"] = "unmasked problem of the same shape (flat KV)"
    row["speedup"] = speed


def run_shape(shape, impls: Sequence[Impl], opts: Options, ceil: floor.Ceilings,
              unavailable: Dict[str, str]) -> dict:
    t0 = time.time()
    device = opts.device
    row = _shape_info(shape, opts.page_size)
    row["kv_bytes"] = floor.kv_bytes(shape)
    row["flops"] = floor.flops(shape)
    row["bound"] = floor.bound(shape, ceil)
    row["floor_us"] = floor.floor_seconds(shape, ceil) * 1e6
    row["impls"] = {}
    row["error"] = None
    sets = []
    case = None
    try:
        n_sets = timing.rotation_sets(inputs_mod.call_bytes(shape)) if opts.rotate else 1
        per_set = inputs_mod.set_bytes_estimate(shape, opts.page_size)
        free = _free_bytes(device)
        if free is not None:
            budget = int(free * opts.mem_fraction)
            if per_set > budget:
                raise MemoryError(f"inputs need ~{per_set / 2**30:.1f} GiB, "
                                  f"{budget / 2**30:.1f} GiB available")
            n_sets = max(1, min(n_sets, budget // max(per_set, 1)))
        case = inputs_mod.build_case(shape, device, page_size=opts.page_size, seed=opts.seed,
                                       slot_runs=opts.slot_runs, kv_slot_runs_hint=opts.kv_slot_runs_hint)
        sets = [inputs_mod.make_inputs(case, i) for i in range(n_sets)]
        row["input_sets"] = n_sets
    except Exception as e:  # noqa: BLE001
        row["error"] = f"setup: {short_reason(e)}"
        row["traceback"] = traceback.format_exc(limit=6)
        sets = []
        case = None
        _empty_cache(device)
        row["seconds"] = time.time() - t0
        return row
    try:
        ref = check.reference(case, sets[0])
    except Exception as e:  # noqa: BLE001 - e.g. out of memory: time anyway, say so
        ref = check.Reference([], {}, "none")
        row["reference_error"] = short_reason(e)
        _empty_cache(device)
    row["check"] = ref.label
    ours_out = None
    other_refs = {}  # "chain" / "dense" -> the reference of that problem (built when needed)
    for impl in impls:
        name = impl.name
        if name in unavailable:
            na = None
            if getattr(impl, "na_before_unavailable", False):
                try:
                    na = impl.applies(case)
                except Exception:  # noqa: BLE001
                    na = None
            if na:
                row["impls"][name] = {"label": impl.label, "status": "n/a", "reason": na}
            else:
                row["impls"][name] = {"label": impl.label, "status": "unavailable",
                                      "reason": unavailable[name]}
            continue
        if name == "flex" and not _wants_flex(shape, opts):
            row["impls"][name] = {"label": impl.label, "status": "skipped",
                                  "reason": "not compiled for this shape (--flex=auto compiles shapes tagged 'flex')"}
            continue
        kind = other_problem(impl, shape)
        if kind is not None and impl.applies(case) is None:
            # a kernel of another problem (FlashMLA's chain on a tree row, a dense
            # kernel): checked against the reference of that problem
            if kind not in other_refs:
                try:
                    other_refs[kind] = check.reference(case, sets[0], causal=kind == "chain",
                                                       dense=kind == "dense")
                except Exception as e:  # noqa: BLE001
                    other_refs[kind] = check.Reference([], {}, "none")
                    row[f"{kind}_reference_error"] = short_reason(e)
                    _empty_cache(device)
                row[f"check_{kind}"] = f"{kind} " + other_refs[kind].label
            res = run_impl(impl, case, sets, other_refs[kind], None, opts, device)
            res["check"] = f"{kind} " + other_refs[kind].label
        else:
            res = run_impl(impl, case, sets, ref, ours_out, opts, device)
        res["competitor"] = impl.competitor
        out = res.pop("_out", None)
        if name == "ours_paged" and res["status"] == "ok":
            ours_out = out
            try:
                row["plan"] = impl.plan(case, sets[0])
            except Exception as e:  # noqa: BLE001
                row["plan"] = {"error": short_reason(e)}
        if name.startswith("ours_paged@") and res["status"] in ("ok", "wrong"):
            try:  # which configuration the forced call really ran (the plan may refuse it)
                res["plan"] = impl.plan(case, sets[0]).get("name")
            except Exception as e:  # noqa: BLE001
                res["plan"] = short_reason(e)
        del out
        row["impls"][name] = res
        try:
            impl.release()
        except Exception:  # noqa: BLE001
            pass
    if ref.label != "ref" and ours_out is not None:
        row["check"] = ref.label + "+ours"
    if opts.rounds > 1:
        retime_rounds(row, impls, case, sets, opts, device)
    summarize(row, shape, ceil)
    del sets, case, ours_out, other_refs
    _empty_cache(device)
    row["seconds"] = time.time() - t0
    return row


def _wants_flex(shape, opts):
    from .shapes import wants_flex

    return wants_flex(shape, opts.flex_policy, opts.grid_name)


def run_all(shapes, impls: Sequence[Impl], opts: Options, ceil: floor.Ceilings, *,
            on_row=None, progress=None, time_budget_s: float = 0.0) -> List[dict]:
    """Run every shape; ``on_row(rows)`` after each (incremental JSON)."""
    unavailable = {}
    for impl in impls:
        try:
            why = impl.unavailable()
        except Exception as e:  # noqa: BLE001
            why = f"unavailable: {short_reason(e)}"
        if why:
            unavailable[impl.name] = why
    rows = []
    start = time.time()
    for shape in shapes:
        if progress is not None:
            progress.describe(shape.name)
        if time_budget_s and time.time() - start > time_budget_s:
            row = _shape_info(shape, opts.page_size)
            row.update(impls={}, error=f"skipped: --time_budget_s={time_budget_s:g} spent")
            rows.append(row)
        else:
            rows.append(run_shape(shape, impls, opts, ceil, unavailable))
        if progress is not None:
            progress.advance()
        if on_row is not None:
            on_row(rows)
    return rows
