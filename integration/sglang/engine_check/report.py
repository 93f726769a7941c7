"""The Engine check's comparisons and summary table, from the ``<mode>.json`` runs.

    python report.py OUT_DIR [MODE...]     # prints the table, writes OUT_DIR/summary.md

Per speculative mode: token-identical to its model's greedy run and to its
Triton twin (the same speculative setup on SGLang's Triton backend), the accept
length (completion tokens / verify steps, all requests), and what reached
verify_attn (target-verify steps it prepared, of them CUDA-graph replays; layer
calls run from Python; plans; the kernels planned).

Every request is compared on its own, up to its first difference from the
greedy run. A difference is a near-tie when the greedy run's top-2
log-probabilities there are within ``TIE_NATS`` and the mode took the other
one of the two: the logits are bf16, and a verify forward (a batch of draft rows, other
kernels, other reduction orders) may round them differently from a decode
step on any backend. Past a near-tie a request follows another path, for which
the greedy run has no reference; it is not compared further. Against the
Triton twin, a difference where either side had already left the greedy path
at a near-tie is not compared either.
"""

import json
import os
import sys

# Two steps of a bf16 logit in [16, 32) (0.125 each): the tiny models' first
# differences from greedy, in SGLang's Triton speculative runs as in ours, sit at
# a top-2 gap of 0 or one such step.
TIE_NATS = 0.25


def first_difference(x, y):
    """Index of the first token where sequences ``x`` and ``y`` differ (a length
    difference counts at the shorter length), else None."""
    for k, (u, v) in enumerate(zip(x, y)):
        if u != v:
            return k
    return None if len(x) == len(y) else min(len(x), len(y))


def tie_gap(greedy, r, k, token):
    """The greedy run's top-2 gap (nats) at request ``r``, token ``k`` when
    ``token`` and the greedy run's own token there are its two top choices (in
    either order: an exact tie lists them either way) and the gap is within
    ``TIE_NATS``; else None."""
    top2 = (greedy or {}).get("top2")
    if not top2 or r >= len(top2) or k >= len(top2[r]) or len(top2[r][k]) < 2:
        return None
    (lp1, tok1), (lp2, tok2) = top2[r][k]
    gap = lp1 - lp2
    return gap if {token, greedy["outputs"][r][k]} == {tok1, tok2} and gap <= TIE_NATS else None


def greedy_divergence(run, greedy, r):
    """``(k, gap)`` where request ``r`` of ``run`` first leaves the greedy run:
    gap is the near-tie's gap, or None for a real difference; None if it never does."""
    a, g = run["outputs"][r], greedy["outputs"][r]
    k = first_difference(a, g)
    if k is None:
        return None
    return (k, tie_gap(greedy, r, k, a[k]) if k < len(a) and k < len(g) else None)


def compare(run, ref, greedy=None):
    """``"yes"``, ``"no (req r, token k)"``, ``"near-tie x n (first: req r, token k, gap g)"``
    or ``"-"`` (a side missing or failed). ``ref`` is the greedy run itself or
    the Triton twin; ``greedy`` (with ``top2``) tells near-ties."""
    if not run or not ref or "outputs" not in run or "outputs" not in ref:
        return "-"
    a, b = run["outputs"], ref["outputs"]
    if len(a) != len(b):
        return f"no (req {min(len(a), len(b))}, token 0)"
    have_greedy = bool(greedy) and "outputs" in greedy and len(greedy["outputs"]) == len(a)
    ties = []
    for r in range(len(a)):
        k = first_difference(a[r], b[r])
        if k is None:
            continue
        if not have_greedy:
            return f"no (req {r}, token {k})"
        # Where each side leaves the greedy path; a difference at or past a
        # near-tie of either side is that near-tie, anything else is real.
        da = greedy_divergence(run, greedy, r)
        db = greedy_divergence(ref, greedy, r) if ref is not greedy else None
        tie = [d for d in (da, db) if d is not None and d[0] <= k and d[1] is not None]
        real = [d for d in (da, db) if d is not None and d[0] <= k and d[1] is None]
        if real or not tie:
            return f"no (req {r}, token {k})"
        ties.append((r, min(d[0] for d in tie), max(d[1] for d in tie)))
    if not ties:
        return "yes"
    r, k, gap = ties[0]
    return f"near-tie x {len(ties)} (first: req {r}, token {k}, gap {gap:.3f})"


def accept_length(run):
    meta = run.get("meta") or []
    steps = sum(m.get("spec_verify_ct", 0) or 0 for m in meta)
    toks = sum(m.get("completion_tokens", 0) or 0 for m in meta)
    return f"{toks / steps:.2f}" if steps else "-"


def row(name, runs):
    from modes import MODES  # noqa: PLC0415

    mode, run = MODES[name], runs.get(name)
    if run is None:
        return [name, "not run", "-", "-", "-", "-", "-"]
    status = "ok" if "error" not in run else "ERROR " + run["error"].splitlines()[0][:120]
    c = run.get("counts") or {}
    served = f"{c.get('verify_steps', 0)} ({c.get('graph_verify_steps', 0)} graph)"
    served += f", {c.get('layer_calls', 0)} layer calls, {c.get('plans', 0)} plans"
    kernels = "; ".join(f"{k} x{n}" for k, n in sorted((c.get("kernels") or {}).items())) or "-"
    greedy = runs.get(mode.greedy)
    twin = compare(run, runs.get(mode.triton_twin), greedy) if mode.triton_twin else "-"
    return [name, status, compare(run, greedy, greedy), twin, accept_length(run), served, kernels]


HEADER = ["mode", "status", "= greedy", "= triton spec", "accept length", "verify_attn: verify steps", "kernels planned"]


def verdict(name, runs):
    """PASS: a verify_attn mode that ran, matched greedy and its twin (or near-tie), and served verify steps."""
    from modes import MODES  # noqa: PLC0415

    r = row(name, runs)
    ok = r[1] == "ok" and not r[2].startswith(("no", "-")) and not r[3].startswith("no")
    if MODES[name].backend == "verify_attn":
        ok = ok and (runs[name].get("counts") or {}).get("verify_steps", 0) > 0
    return ok


def table(names, runs):
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row(n, runs)) + " |" for n in names if "_greedy_" not in n]
    for n in names:
        if "_greedy_" in n:
            run = runs.get(n) or {}
            lines.append(f"\n{n}: " + ("ok" if run and "error" not in run else "ERROR " + str(run.get("error", "not run"))[:200]))
    return "\n".join(lines)


def load_runs(out_dir, names):
    runs = {}
    for n in names:
        p = os.path.join(out_dir, f"{n}.json")
        if os.path.exists(p):
            with open(p) as f:
                runs[n] = json.load(f)
    return runs


def main(out_dir, names):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from modes import default_order  # noqa: PLC0415

    names = names or default_order()
    runs = load_runs(out_dir, names)
    text = table(names, runs)
    spec = [n for n in names if "_greedy_" not in n and n in runs]
    passed = [n for n in spec if verdict(n, runs)]
    text += f"\n\nENGINE CHECK: {len(passed)}/{len(spec)} speculative modes pass (of {len(names)} modes asked)\n"
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if len(passed) == len(spec) == len(names) - sum("_greedy_" in n for n in names) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
