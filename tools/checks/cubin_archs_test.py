"""The extension carries a cubin for every arch it reports, and nothing else.

Runs the pinned `cuobjdump --list-elf` (from @cuda_tools) on bindings/_C.so
and prints `cuobjdump --dump-resource-usage` (registers, shared memory, stack
per kernel and arch) so CI logs show the resource report.
"""

import os
import re
import subprocess
import sys


def _runfile(rel):
    base = os.environ.get("TEST_SRCDIR") or os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(base, rel), os.path.join(base, "verify_attn", rel)):
        if os.path.exists(cand):
            return cand
    raise FileNotFoundError(rel)


def main():
    cuobjdump, lib, expected = sys.argv[1], sys.argv[2], sys.argv[3]
    cuobjdump = _runfile(cuobjdump) if not os.path.exists(cuobjdump) else cuobjdump
    lib = _runfile(lib) if not os.path.exists(lib) else lib
    want = set(expected.split(","))
    elf = subprocess.run([cuobjdump, "--list-elf", lib], check=True,
                         capture_output=True, text=True).stdout
    print(elf)
    found = set(re.findall(r"\.(sm_\d+a?)\.cubin", elf))
    print("expected archs:", sorted(want), "found:", sorted(found))
    usage = subprocess.run([cuobjdump, "--dump-resource-usage", lib], check=True,
                           capture_output=True, text=True).stdout
    print(usage)
    if found != want:
        print("FAIL: cubin archs differ from the build setting")
        sys.exit(1)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
