"""The Engine check's comparisons and summary table, from the ``<mode>.json`` runs.

    python report.py OUT_DIR [MODE...]     # prints the table, writes OUT_DIR/summary.md

Per speculative mode: token-identical to its model's greedy run and to its
Triton twin (the same speculative setup on SGLang's Triton backend), the accept
length (completion tokens / verify steps, all requests), and what reached
verify_attn (target-verify steps it prepared, of them CUDA-graph replays; layer
calls run from Python; plans; the kernels planned). A first difference is
called a near-tie when the greedy run's top-2 log-probabilities at that token
are within ``TIE_NATS`` and the mode took the second one: bf16 rounding of a
verify forward may flip such a token on any backend.
"""

import json
import os
import sys

TIE_NATS = 0.1


def first_difference(a, b):
    """``None`` if every request's tokens agree, else ``(request, token)`` of the first difference."""
    if len(a) != len(b):
        return (min(len(a), len(b)), 0)
    for r, (x, y) in enumerate(zip(a, b)):
        for k, (u, v) in enumerate(zip(x, y)):
            if u != v:
                return (r, k)
        if len(x) != len(y):
            return (r, min(len(x), len(y)))
    return None


def near_tie(greedy, a, b, where):
    """The greedy run's top-2 gap (nats) at ``where`` when ``a`` and ``b`` share the
    greedy prefix of that request up to it, took its two top tokens there, and
    the gap is within ``TIE_NATS``; else None."""
    top2 = (greedy or {}).get("top2")
    r, k = where
    if not top2 or r >= min(len(top2), len(a), len(b)) or k >= len(top2[r]) or len(top2[r][k]) < 2:
        return None
    if k >= len(a[r]) or k >= len(b[r]) or a[r][:k] != greedy["outputs"][r][:k]:
        return None
    (lp1, tok1), (lp2, tok2) = top2[r][k]
    gap = lp1 - lp2
    return gap if {a[r][k], b[r][k]} == {tok1, tok2} and gap <= TIE_NATS else None


def compare(run, ref, greedy=None):
    """``"yes"``, ``"no (req r, token k)"``, ``"near-tie (req r, token k, gap g)"`` or ``"-"``
    (a side missing or failed). ``greedy`` (with ``top2``) tells near-ties."""
    if not run or not ref or "outputs" not in run or "outputs" not in ref:
        return "-"
    where = first_difference(run["outputs"], ref["outputs"])
    if where is None:
        return "yes"
    gap = near_tie(greedy, run["outputs"], ref["outputs"], where) if greedy else None
    if gap is not None:
        return f"near-tie (req {where[0]}, token {where[1]}, gap {gap:.3f})"
    return f"no (req {where[0]}, token {where[1]})"


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
