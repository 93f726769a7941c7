"""Summarise an alternating A/B of two wheels (tools/dev/ab_bench.sh).

Reads ``ab_A_<run>.json`` / ``ab_B_<run>.json`` (tools/bench/bench.py output) from a
folder and prints, per shape: the median over runs of our paged kernel's
median time (CUDA-graph replay when timed, else eager) for A and B, B/A - 1,
and each wheel's FlashMLA-chain ratio (FlashMLA's time in the same process /
ours; > 1: ours faster). A row whose check was wrong in any run is flagged.

  python3 tools/dev/ab_compare.py FOLDER [--impl=ours_flat]

--impl: which of our columns to compare (ours_paged by default; ours_flat: the
flat layout's kernel, which every bench run times too).
"""

import argparse
import glob
import json
import os
import statistics
import sys

from tabulate import tabulate


def _us(impl):
    if not impl or impl.get("status") not in ("ok", "wrong"):
        return None
    for mode in ("graph", "eager"):
        t = (impl.get(mode) or {}).get("median_us")
        if t is not None:
            return t
    return None


def load(folder, tag, impl="ours_paged"):
    """{shape: {"ours": [us...], "fmla": [us...], "wrong": bool}} over the runs of one wheel."""
    out = {}
    files = sorted(glob.glob(os.path.join(folder, f"ab_{tag}_*.json")))
    for path in files:
        with open(path) as f:
            rows = json.load(f)["rows"]
        for row in rows:
            d = out.setdefault(row["shape"], {"ours": [], "fmla": [], "wrong": False})
            impls = row.get("impls", {})
            ours = impls.get(impl)
            if _us(ours) is not None:
                d["ours"].append(_us(ours))
            if _us(impls.get("flashmla")) is not None:
                d["fmla"].append(_us(impls.get("flashmla")))
            d["wrong"] |= bool(ours and ours.get("status") == "wrong")
    return out, len(files)


def main(folder, impl="ours_paged"):
    a, na = load(folder, "A", impl)
    b, nb = load(folder, "B", impl)
    if not na or not nb:
        print(f"ab_compare: no ab_A_*.json / ab_B_*.json in {folder}", file=sys.stderr)
        return 2
    body = []
    for shape in a:
        if shape not in b or not a[shape]["ours"] or not b[shape]["ours"]:
            continue
        ta, tb = statistics.median(a[shape]["ours"]), statistics.median(b[shape]["ours"])
        fa = statistics.median(a[shape]["fmla"]) if a[shape]["fmla"] else None
        fb = statistics.median(b[shape]["fmla"]) if b[shape]["fmla"] else None
        flag = "WRONG" if a[shape]["wrong"] or b[shape]["wrong"] else ""
        body.append([shape, f"{ta:.1f}", f"{tb:.1f}", f"{100 * (tb / ta - 1):+.1f}%",
                     f"{fa / ta:.3f}" if fa else "--", f"{fb / tb:.3f}" if fb else "--",
                     " ".join(f"{x:.1f}" for x in a[shape]["ours"]), " ".join(f"{x:.1f}" for x in b[shape]["ours"]),
                     flag])
    print(f"A/B of {impl} over {na} + {nb} runs (medians of per-run medians, us; "
          "FMLA ratio = FlashMLA chain / ours)")
    print(tabulate(body, headers=["shape", "A us", "B us", "B/A-1", "A xFMLA", "B xFMLA", "A runs", "B runs", ""],
                   disable_numparse=True))
    return 1 if any(r[-1] for r in body) else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Summarise an alternating A/B (tools/dev/ab_bench.sh).")
    ap.add_argument("folder", nargs="?", default=os.environ.get("OUT", "/tmp/va_ab"))
    ap.add_argument("--impl", default="ours_paged", help="our column to compare: ours_paged or ours_flat")
    args = ap.parse_args()
    sys.exit(main(args.folder, args.impl))
