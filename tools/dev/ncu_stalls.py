"""Where a kernel's warps wait, from an ncu source-page export (a design aid).

Input: the per-instruction table Nsight Compute writes for a report profiled
with `--section SourceCounters --section WarpStateStats`:

    ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv

(`NCU_SOURCE=1 bash tools/dev/ncu_case.sh` on the GPU machine writes it as
$OUT/ncu_source.csv.gz). Output: the warp-stall samples grouped by what the
warps were waiting for, and the instructions with the most samples, each with
its main stall reason and the two instructions before it (a try-wait loop's
branch shows up as the hot instruction; the SYNCS line before it names the
barrier). A producer that reads its row offsets through a volatile pointer
between its copies, for example, shows up as hot `LD.E.64.STRONG.SYS` lines:
one memory latency per copy, which the kernel-level metrics do not point to.

    bazel run //tools/dev:ncu_stalls -- --csv=/path/src.csv.gz --top=30
"""

import csv
import gzip
import io
import re

from absl import app, flags

flags.DEFINE_string("csv", None, "ncu --page source --csv export (plain or .gz).")
flags.DEFINE_integer("top", 25, "How many of the hottest instructions to list.")
flags.DEFINE_float("min_share", 0.0, "Only list instructions with at least this share of the samples.")
FLAGS = flags.FLAGS

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"

# What a warp at this instruction is waiting for, from the instruction itself
# or (for the branch of a try-wait loop) the one before it.
KINDS = [
    ("mbarrier wait", re.compile(r"SYNCS\.PHASECHK|SYNCS\.ARRIVE")),
    ("wgmma wait", re.compile(r"WARPGROUP\.DEPBAR")),
    ("wgmma issue", re.compile(r"HGMMA|WARPGROUP\.ARRIVE")),
    ("named barrier", re.compile(r"\bBAR\.(SYNC|ARV|RED)")),
    ("async copy", re.compile(r"LDGSTS|LDGDEPBAR|DEPBAR\.LE SB")),
    ("shared memory", re.compile(r"\b(LDS|STS|LDSM|STSM)\b")),
    ("global / generic memory", re.compile(r"\b(LDG|STG|LD|ST)\.")),
]


def read_rows(path):
    """(header, rows) of the export; the kernel-name line before the header is skipped."""
    raw = open(path, "rb").read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    lines = list(csv.reader(io.StringIO(raw.decode("utf-8", "replace"))))
    for i, row in enumerate(lines):
        if SAMPLES in row and "Source" in row:
            return row, [r for r in lines[i + 1:] if len(r) == len(row)]
    raise ValueError(f"{path}: no '{SAMPLES}' column: export with --page source --csv "
                     "from a report profiled with --section SourceCounters --section WarpStateStats")


def as_int(text):
    try:
        return int(float(text))
    except ValueError:
        return 0


# Stall reasons that mean "waiting on an earlier instruction": only then is a
# sample charged to what the instructions just before it are.
DEPENDENT = ("long_sb", "short_sb", "barrier", "membar", "wait")


def kind_of(source, before, reason):
    """The first known kind of the instruction itself, else (when it waits on an
    earlier one) of the two before it: a sampled warp sits at the instruction
    that cannot issue yet (the branch of a try-wait loop, the first user of a
    load's register, the instruction after a bar.sync)."""
    texts = [source] + (list(reversed(before)) if reason in DEPENDENT else [])
    for text in texts:
        for name, pattern in KINDS:
            if pattern.search(text):
                return name
    return "other"


def summarize(header, rows, top, min_share=0.0):
    """Returns (total samples, {kind: samples}, [hot instruction dicts])."""
    col = {name: i for i, name in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(as_int(r[col[SAMPLES]]) for r in rows)
    by_kind, hot = {}, []
    for i, r in enumerate(rows):
        n = as_int(r[col[SAMPLES]])
        before = [rows[j][col["Source"]].strip() for j in range(max(0, i - 2), i)]
        main_stall = max(stalls, key=lambda s: as_int(r[col[s]])) if stalls else None
        reason = main_stall[6:] if main_stall and as_int(r[col[main_stall]]) > 0 else ""
        kind = kind_of(r[col["Source"]], before, reason)
        by_kind[kind] = by_kind.get(kind, 0) + n
        if n:
            hot.append({
                "address": r[col["Address"]],
                "source": r[col["Source"]].strip(),
                "samples": n,
                "share": n / total if total else 0.0,
                "executed": as_int(r[col[EXECUTED]]) if EXECUTED in col else 0,
                "reason": reason,
                "kind": kind,
                "before": before,
            })
    hot.sort(key=lambda h: -h["samples"])
    hot = [h for h in hot if h["share"] >= min_share][:top]
    return total, by_kind, hot


def main(argv):
    del argv
    if not FLAGS.csv:
        raise app.UsageError("--csv is required (ncu --page source --csv export)")
    header, rows = read_rows(FLAGS.csv)
    total, by_kind, hot = summarize(header, rows, FLAGS.top, FLAGS.min_share)
    print(f"{len(rows)} instructions, {total} warp-stall samples")
    for kind, n in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:24s} {n:8d}  {100.0 * n / max(total, 1):5.1f}%")
    print()
    for h in hot:
        before = " | ".join(b[:48] for b in h["before"])
        print(f"{h['address']:>18} {100 * h['share']:5.1f}% {h['reason']:14s} x{h['executed']:<8d} "
              f"{h['source'][:56]:56s} <- {before}")


if __name__ == "__main__":
    app.run(main)
