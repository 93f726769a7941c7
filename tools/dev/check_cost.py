#!/usr/bin/env python3
"""Cost of the device-side error checking: our paged kernel with ``error_word``
passed (the product default) vs NULL, on the bench's quick grid.

    python3 tools/dev/check_cost.py [--grid quick] [--shapes PATTERNS] [--rounds 3] [--json PATH]

For each shape (inputs and L2 rotation as in ``tools/bench/bench.py``, page size 1)
the two variants are timed alternately, ``--rounds`` times each, eagerly and
as CUDA-graph replays (:mod:`benchlib.timing`); per variant the median of the
round medians is kept. The NULL variant is obtained by making the API pass
``error_word = 0`` (``verify_attn.errors.error_word_ptr`` patched for the
duration), nothing else changes. Relative cost = t(with) / t(NULL) - 1; the
summary gives the geometric mean and the maximum over shapes, graph replay
being the product configuration (goal: under 2%).

What this isolates: the kernel's writes of the error word and the host-side
lookup of the device's buffer (eager only). The in-kernel bounds comparisons
(page id within [0, num_pages), lengths) run in both variants: they are
unconditional, so their own cost would need a build without them.

Runs from the source tree (``tools/bench/`` on sys.path for ``benchlib``) with
the installed verify_attn. Exit 2 without a GPU.
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import sys

# benchlib: tools/bench/benchlib, beside this script's folder tools/dev/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import torch  # noqa: E402

GOAL = 0.02


@contextlib.contextmanager
def error_word_null():
    import verify_attn.errors as errors

    saved = errors.error_word_ptr
    errors.error_word_ptr = lambda device: 0
    try:
        yield
    finally:
        errors.error_word_ptr = saved


def time_variant(fns, device, mode, null, tkw):
    from benchlib import timing

    ctx = error_word_null() if null else contextlib.nullcontext()
    with ctx:
        t = timing.time_eager(fns, device, **tkw) if mode == "eager" else timing.time_graph(fns, device, **tkw)
    return t.median_us


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default="quick")
    ap.add_argument("--shapes", default=None, help="comma-separated name patterns")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target_ms", type=float, default=100.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_cost: no CUDA device")
        return 2
    import verify_attn
    from benchlib import inputs as inputs_mod, shapes as shapes_mod, timing
    from benchlib.ours import OursPaged

    device = "cuda"
    verify_attn.ensure_error_buffer()
    impl = OursPaged()
    tkw = dict(warmup=3, target_ms=args.target_ms, min_iters=10, max_iters=300)
    shapes = shapes_mod.filter_shapes(shapes_mod.grid(args.grid), args.shapes)
    rows = []
    print("%-44s %10s %10s %8s %10s %10s %8s" % ("shape", "graph us", "NULL us", "cost", "eager us",
                                                  "NULL us", "cost"))
    for shape in shapes:
        row = {"shape": shape.name}
        try:
            free = torch.cuda.mem_get_info()[0]
            per_set = inputs_mod.set_bytes_estimate(shape, 1)
            n_sets = timing.rotation_sets(inputs_mod.call_bytes(shape))
            n_sets = max(1, min(n_sets, int(0.6 * free) // max(per_set, 1)))
            case = inputs_mod.build_case(shape, device, page_size=1, seed=0)
            sets = [inputs_mod.make_inputs(case, i) for i in range(n_sets)]
            fns = [impl.prepare(case, s) for s in sets]
            for mode in ("graph", "eager"):
                ts = {False: [], True: []}
                for _ in range(args.rounds):
                    for null in (False, True):
                        ts[null].append(time_variant(fns, device, mode, null, tkw))
                w, n = statistics.median(ts[False]), statistics.median(ts[True])
                row[mode] = {"with_us": w, "null_us": n, "cost": w / n - 1.0}
            verify_attn.check_errors()  # valid inputs: nothing flagged
        except Exception as e:  # noqa: BLE001 - reported in the row
            row["error"] = "%s: %s" % (type(e).__name__, str(e)[:200])
        rows.append(row)
        if "error" in row:
            print("%-44s %s" % (shape.name[:44], row["error"]))
        else:
            g, e = row["graph"], row["eager"]
            print("%-44s %10.1f %10.1f %+7.2f%% %10.1f %10.1f %+7.2f%%" % (
                shape.name[:44], g["with_us"], g["null_us"], 100 * g["cost"], e["with_us"], e["null_us"],
                100 * e["cost"]), flush=True)
        sets = fns = case = None
        torch.cuda.empty_cache()

    def agg(mode):
        cs = [r[mode]["cost"] for r in rows if mode in r]
        if not cs:
            return None, None
        gm = math.exp(sum(math.log1p(c) for c in cs) / len(cs)) - 1.0
        return gm, max(cs)

    gg, gmax = agg("graph")
    eg, emax = agg("eager")
    summary = dict(grid=args.grid, shapes=len(rows), failed=sum("error" in r for r in rows),
                   graph_geomean=gg, graph_max=gmax, eager_geomean=eg, eager_max=emax, goal=GOAL,
                   device=torch.cuda.get_device_name(), rows=rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if gg is None:
        print("check cost: no shape measured")
        return 1
    print("check cost (error_word vs NULL, %d shapes): graph replay geomean %+.2f%%, max %+.2f%%; "
          "eager geomean %+.2f%%, max %+.2f%% (goal < %.0f%%: %s)" % (
              len(rows) - summary["failed"], 100 * gg, 100 * gmax, 100 * eg, 100 * emax, 100 * GOAL,
              "met" if gg < GOAL else "NOT met"))
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
