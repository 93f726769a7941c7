"""CPU test of tools/dev/ncu_stalls.py (the ncu source-page summary) on a small
hand-made export: sample totals, the grouping by what the warps wait for, and
the ordering of the hottest instructions."""

import csv
import gzip
import io

import pytest


HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed",
          "stall_long_sb", "stall_barrier", "stall_short_sb", "stall_long_sb (Not Issued)"]
ROWS = [
    ["0x10", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R0+URZ+0x48], R7", "2", "2", "100", "2", "0", "0", "2"],
    ["0x20", "@!P0  BRA 0x90", "50", "50", "100", "49", "0", "1", "49"],
    ["0x30", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", "0", "0", "10", "0", "0", "0", "0"],
    ["0x40", "SHFL.BFLY PT, R9, R8, 0x1, 0x1f", "30", "30", "10", "0", "30", "0", "0"],
    ["0x50", "HGMMA.64x64x16.F32.BF16 R152, gdesc[UR20], R152, gsb0", "5", "1", "36", "0", "0", "0", "0"],
    ["0x60", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "10", "10", "4", "0", "10", "0", "0"],
    ["0x70", "FADD R1, R2, R3", "3", "1", "500", "0", "0", "0", "0"],
]


def _write(tmp_path, gz):
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["Kernel Name", "void k(int)"])  # ncu's first line
    w.writerow(HEADER)
    w.writerows(ROWS)
    path = tmp_path / ("src.csv.gz" if gz else "src.csv")
    data = buf.getvalue().encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


@pytest.mark.parametrize("gz", [False, True])
def test_summary_groups_and_orders(tmp_path, gz, load_tool):
    tool = load_tool("ncu_stalls")
    header, rows = tool.read_rows(_write(tmp_path, gz))
    assert len(rows) == len(ROWS)
    total, by_kind, hot = tool.summarize(header, rows, top=3)
    assert total == 100
    # the try-wait branch counts as an mbarrier wait (with its SYNCS line), the
    # instruction after bar.sync as the named barrier, the DEPBAR as a wgmma wait
    assert by_kind["mbarrier wait"] == 52
    assert by_kind["named barrier"] == 30
    assert by_kind["wgmma wait"] == 10
    assert by_kind["wgmma issue"] == 5
    assert by_kind["other"] == 3
    assert sum(by_kind.values()) == total
    assert [h["address"] for h in hot] == ["0x20", "0x40", "0x60"]
    assert hot[0]["reason"] == "long_sb" and hot[0]["share"] == pytest.approx(0.5)
    assert hot[1]["reason"] == "barrier"
    assert hot[0]["before"][-1].startswith("SYNCS.PHASECHK")


def test_min_share_filters(tmp_path, load_tool):
    tool = load_tool("ncu_stalls")
    header, rows = tool.read_rows(_write(tmp_path, False))
    _, _, hot = tool.summarize(header, rows, top=10, min_share=0.2)
    assert [h["address"] for h in hot] == ["0x20", "0x40"]


def test_rejects_export_without_samples(tmp_path, load_tool):
    tool = load_tool("ncu_stalls")
    path = tmp_path / "bad.csv"
    path.write_text('"Address","Source"\n"0x10","NOP"\n')
    with pytest.raises(ValueError, match="SourceCounters"):
        tool.read_rows(str(path))
