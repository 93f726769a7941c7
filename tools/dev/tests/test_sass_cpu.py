"""CPU test of tools/dev/sass.py (registers, SASS size and spills per kernel) on
hand-made cuobjdump listings: the parsers, the opcode counts (guard predicates
dropped, prefix match), the kernel filter, and the missing-binary error."""

import pytest

RES = """
Fatbin elf code:
================
arch = sm_90a

Resource usage:
 Common:
  GLOBAL:0
 Function _Z7kernelAv:
  REG:168 STACK:16 SHARED:2048 LOCAL:16 CONSTANT[0]:1408 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z7kernelBv:
  REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:900 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

SASS = """
\tcode for sm_90a
\t\tFunction : _Z7kernelAv
\t.headerflags\t@"EF_CUDA_ACCELERATORS EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
                                                                           /* 0x000fe20000000800 */
        /*0010*/                   STL [R1+0x4], R0 ;                      /* 0x0000040001007387 */
        /*0020*/              @!PT LDS RZ, [RZ] ;                          /* 0x0000000000 */
        /*0030*/                   LDGSTS.E.BYPASS.128.ZFILL [R3], desc[UR26][R4.64], P0 ;  /* 0x0 */
        /*0040*/               @P1 LDGSTS.E.BYPASS.128 [R3+0x800], desc[UR26][R6.64] ;  /* 0x0 */
        /*0050*/                   LDL R2, [R1+0x4] ;                      /* 0x0 */
        /*0060*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;  /* 0x0 */
        /*0070*/                   EXIT ;                                  /* 0x0 */
\t\t..........

\t\tFunction : _Z7kernelBv
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x0 */
        /*0010*/                   EXIT ;                                  /* 0x0 */
"""


def test_parsers_and_summary(load_tool):
    tool = load_tool("sass")
    res = tool.parse_res_usage(RES)
    assert res == {
        "_Z7kernelAv": {"REG": 168, "STACK": 16, "SHARED": 2048, "LOCAL": 16, "CONSTANT[0]": 1408,
                        "TEXTURE": 0, "SURFACE": 0, "SAMPLER": 0},
        "_Z7kernelBv": {"REG": 40, "STACK": 0, "SHARED": 0, "LOCAL": 0, "CONSTANT[0]": 900,
                        "TEXTURE": 0, "SURFACE": 0, "SAMPLER": 0},
    }
    sass = tool.parse_sass(SASS)
    assert len(sass["_Z7kernelAv"]) == 8 and len(sass["_Z7kernelBv"]) == 2, sass
    assert sass["_Z7kernelAv"][2] == "@!PT LDS RZ, [RZ]"
    assert tool.opcode("@!PT LDS RZ, [RZ]") == "LDS"
    assert tool.opcode("@P1 LDGSTS.E.BYPASS.128 [R3+0x800], desc[UR26][R6.64]") == "LDGSTS.E.BYPASS.128"

    rows = tool.summarize(res, sass, ".", ["LDGSTS", "HGMMA", "LDS", "BAR"])
    assert [r["kernel"] for r in rows] == ["_Z7kernelAv", "_Z7kernelBv"]
    a, b = rows
    assert (a["regs"], a["stack"], a["local"], a["instructions"]) == (168, 16, 16, 8)
    assert (a["STL"], a["LDL"], a["LDGSTS"], a["HGMMA"], a["LDS"], a["BAR"]) == (1, 1, 2, 1, 1, 0)
    assert (b["regs"], b["instructions"], b["STL"], b["LDL"], b["LDGSTS"]) == (40, 2, 0, 0, 0)

    only_b = tool.summarize(res, sass, "kernelB", [])
    assert [r["kernel"] for r in only_b] == ["_Z7kernelBv"]
    assert tool.summarize(res, sass, "nothing_matches", []) == []


def test_demangle_keeps_count(load_tool):
    tool = load_tool("sass")
    names = ["_Z7kernelAv", "not_mangled"]
    out = tool.demangle(names)
    assert len(out) == 2 and out[1] == "not_mangled"
    assert out[0] in ("kernelA()", "_Z7kernelAv")  # c++filt where the machine has it


def test_missing_binary_is_a_clear_error(load_tool, tmp_path):
    tool = load_tool("sass")
    tool.FLAGS(["sass", f"--cuobjdump={tmp_path}/none", f"--nvdisasm={tmp_path}/none",
                f"--object={tmp_path}/none.so"])
    with pytest.raises(SystemExit, match=r"--cuobjdump: no such file"):
        tool.main([])
