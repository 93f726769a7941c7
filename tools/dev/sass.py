"""What ptxas made of our kernels: registers, stack, SASS size, spills (a design aid).

    bazel run //tools/dev:sass -- --kernel=mla_seesaw --arch=sm_90a
    bazel run //tools/dev:sass -- --kernel='mla_wgmma_kernel.*bfloat16.*Paged' --count=LDGSTS,HGMMA \\
        --dump=/tmp/wgmma.sass

Reads the extension Bazel built (//bindings:_C.so: every kernel of the
library, one cubin per configured arch) with the pinned cuobjdump and nvdisasm
of @cuda_tools (13.2 wheels: they read the 13.0 toolkit's binaries; used to
inspect what we built, never to build). For each kernel whose mangled name
matches --kernel (a regular expression, searched), one row: its registers,
stack and local-memory bytes (`cuobjdump -res-usage`), its SASS instruction
count, its local-memory stores / loads (STL / LDL: register spills, the
`-Xptxas -warn-spills` warning of the build counted per kernel), and the count
of each opcode named by --count (prefix match: LDGSTS counts
LDGSTS.E.BYPASS.128.ZFILL too). Names are demangled with c++filt when the
machine has it. --dump writes the matching kernels' SASS to a file.

The SASS counts are how the BENCHMARKS entries compare two builds (e.g. "TMA
kernel 11,640 -> 10,088 instructions, no spills"); build each, run this on
each, compare.
"""

import os
import re
import shutil
import subprocess
import sys

from absl import app, flags

flags.DEFINE_string("cuobjdump", None, "cuobjdump binary (the BUILD target passes @cuda_tools').")
flags.DEFINE_string("nvdisasm", None, "nvdisasm binary (cuobjdump -sass runs it; @cuda_tools').")
flags.DEFINE_string("object", None, "ELF with the cubins: the extension (default from the BUILD target) "
                    "or any .o / .so / .cubin nvcc wrote.")
flags.DEFINE_string("arch", "sm_90a", "Which cubin of the object (cuobjdump -arch), e.g. sm_90a, sm_120a.")
flags.DEFINE_string("kernel", ".", "Regular expression searched in each kernel's mangled name.")
flags.DEFINE_list("count", [], "Opcodes to count per kernel (prefix match), e.g. LDGSTS,HGMMA,BAR.")
flags.DEFINE_string("dump", None, "Write the matching kernels' SASS here.")
FLAGS = flags.FLAGS

_FUNC_RES = re.compile(r"^\s*Function (\S+):\s*$")
_RES = re.compile(r"(\w+(?:\[\d+\])?):(\d+)")
_FUNC_SASS = re.compile(r"^\s*Function : (\S+)\s*$")
# "        /*0a40*/                   @!P0 BRA 0x1230 ;     /* 0x... */"
_INSTR = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")


def parse_res_usage(text):
    """{mangled name: {"REG": n, "STACK": n, "LOCAL": n, ...}} from `cuobjdump -res-usage`."""
    out, name = {}, None
    for line in text.splitlines():
        m = _FUNC_RES.match(line)
        if m:
            name = m.group(1)
            continue
        if name is not None and "REG:" in line:
            out[name] = {k: int(v) for k, v in _RES.findall(line)}
            name = None
    return out


def opcode(instr):
    """The opcode of one SASS instruction text (its guard predicate dropped)."""
    parts = instr.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0] if parts else ""


def parse_sass(text):
    """{mangled name: [instruction texts]} from `cuobjdump -sass` (nvdisasm's listing)."""
    out, name = {}, None
    for line in text.splitlines():
        m = _FUNC_SASS.match(line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        if name is not None:
            m = _INSTR.match(line)
            if m:
                out[name].append(m.group(1))
    return out


def summarize(res, sass, pattern, counts):
    """One dict per kernel matching `pattern` (sorted by name): registers, stack,
    local bytes, instructions, STL / LDL, and the --count opcodes."""
    rx = re.compile(pattern)
    rows = []
    for name in sorted(set(res) | set(sass)):
        if not rx.search(name):
            continue
        instrs = sass.get(name, [])
        ops = [opcode(i) for i in instrs]
        r = res.get(name, {})
        row = {
            "kernel": name,
            "regs": r.get("REG"),
            "stack": r.get("STACK"),
            "local": r.get("LOCAL"),
            "instructions": len(instrs),
            "STL": sum(op.startswith("STL") for op in ops),
            "LDL": sum(op.startswith("LDL") for op in ops),
        }
        for c in counts:
            row[c] = sum(op.startswith(c) for op in ops)
        rows.append(row)
    return rows


def demangle(names):
    """c++filt's readable names (the mangled ones where it is missing or fails)."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return list(names)
    try:
        res = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return list(names)
    out = res.stdout.splitlines()
    return out if len(out) == len(names) else list(names)


def _run(args, env=None):
    res = subprocess.run(args, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"sass: {' '.join(args[:3])} ... failed ({res.returncode}):\n{res.stderr.strip()}")
    return res.stdout


def main(argv):
    del argv
    for flag in ("cuobjdump", "nvdisasm", "object"):
        path = getattr(FLAGS, flag)
        if not path or not os.path.exists(path):
            raise SystemExit(f"sass: --{flag}: no such file: {path!r} (run it as `bazel run //tools/dev:sass`)")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(os.path.abspath(FLAGS.nvdisasm)) + os.pathsep + env.get("PATH", "")
    res = parse_res_usage(_run([FLAGS.cuobjdump, "-res-usage", "-arch", FLAGS.arch, FLAGS.object]))
    sass_text = _run([FLAGS.cuobjdump, "-sass", "-arch", FLAGS.arch, FLAGS.object], env=env)
    sass = parse_sass(sass_text)
    if not res and not sass:
        raise SystemExit(f"sass: {FLAGS.object} has no {FLAGS.arch} cubin (see `cuobjdump -lelf`)")
    rows = summarize(res, sass, FLAGS.kernel, FLAGS.count)
    if not rows:
        raise SystemExit(f"sass: no {FLAGS.arch} kernel matches --kernel={FLAGS.kernel!r}")
    from tabulate import tabulate

    names = demangle([r["kernel"] for r in rows])
    table = [[n] + [r[k] for k in r if k != "kernel"] for n, r in zip(names, rows)]
    print(tabulate(table, headers=["kernel"] + [k for k in rows[0] if k != "kernel"], intfmt=","))
    if FLAGS.dump:
        with open(FLAGS.dump, "w") as f:
            for name, readable in zip([r["kernel"] for r in rows], names):
                f.write(f"// {readable}\n// {name}\n")
                f.write("\n".join(sass.get(name, [])) + "\n\n")
        print(f"SASS of {len(rows)} kernel(s): {FLAGS.dump}", file=sys.stderr)


if __name__ == "__main__":
    app.run(main)
