"""CPU test of tools/dev/ab_compare.py (the summary of tools/dev/ab_bench.sh) on
hand-made bench JSON files."""

import json
import subprocess
import sys


def test_ab_compare_summarises_alternating_runs(tmp_path, tool_path):
    """Per shape the median of the per-run medians of each wheel, B/A - 1,
    FlashMLA / ours, and a non-zero exit when a check was wrong."""

    def run(tag, i, ours_us, fmla_us, status="ok"):
        rows = [{"shape": "mla B1 H16 T64 L32k ddtree", "impls": {
            "ours_paged": {"status": status, "graph": {"median_us": ours_us}, "eager": {"median_us": 2 * ours_us}},
            "ours_flat": {"status": "ok", "graph": {"median_us": ours_us / 2}},
            "flashmla": {"status": "ok", "graph": {"median_us": fmla_us}}}},
            {"shape": "mla B1 H16 T16 L4k chain", "impls": {
                "ours_paged": {"status": "ok", "eager": {"median_us": 20.0 + i}}}}]
        (tmp_path / f"ab_{tag}_{i}.json").write_text(json.dumps({"rows": rows}))

    for i, (a, b) in enumerate([(100.0, 90.0), (110.0, 94.0), (102.0, 92.0)], start=1):  # mean of A: 104
        run("A", i, a, 120.0)
        run("B", i, b, 108.0)
    ab = tool_path("ab_compare.py")
    r = subprocess.run([sys.executable, ab, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("mla B1 H16 T64 L32k"))
    cells = line.split()
    # A median 102, B median 92: -9.8%; FlashMLA 120 / 102 = 1.176, 108 / 92 = 1.174
    assert cells[6:10] == ["102.0", "92.0", "-9.8%", "1.176"] and cells[10] == "1.174", line
    chain = next(x for x in r.stdout.splitlines() if x.startswith("mla B1 H16 T16 L4k chain"))
    assert "22.0" in chain.split() and "+0.0%" in chain.split(), chain  # eager when no graph time
    r = subprocess.run([sys.executable, ab, str(tmp_path), "--impl=ours_flat"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "A/B of ours_flat" in r.stdout, r.stdout + r.stderr
    cells = next(x for x in r.stdout.splitlines() if x.startswith("mla B1 H16 T64 L32k")).split()
    assert cells[6:10] == ["51.0", "46.0", "-9.8%", "2.353"], cells  # the flat column: half the paged times
    run("B", 2, 94.0, 108.0, status="wrong")
    r = subprocess.run([sys.executable, ab, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "WRONG" in r.stdout, r.stdout
