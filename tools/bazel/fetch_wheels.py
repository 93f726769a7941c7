"""Fetch pinned wheels from the package index by name, verify, and unpack.

Used by the `pypi_wheels` repository rule (tools/bazel/pypi_wheels.bzl).
pip resolves each `name==version` against the configured package index (no
URL appears anywhere in this repository) and `--require-hashes` makes pip
refuse any file whose sha256 differs from the pin. The wheels are then
unpacked with their Unix permission bits (zipfile alone drops them, and
nvcc, ptxas, cicc must stay executable).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile

PLATFORMS = [
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux2010_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
]


def unpack(wheel, dest):
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            path = zf.extract(info, dest)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dest", required=True)
    ap.add_argument("pins", nargs="+", help="name==version:sha256")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        req = os.path.join(tmp, "requirements.txt")
        with open(req, "w") as f:
            for pin in args.pins:
                spec, sha = pin.rsplit(":", 1)
                f.write("%s --hash=sha256:%s\n" % (spec, sha))
        cmd = [sys.executable, "-m", "pip", "download", "--quiet",
               "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "--require-hashes", "-r", req,
               "-d", os.path.join(tmp, "wheels")]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        subprocess.run(cmd, check=True)
        wheels = sorted(os.listdir(os.path.join(tmp, "wheels")))
        if len(wheels) != len(args.pins):
            sys.exit("expected %d wheels, got %s" % (len(args.pins), wheels))
        for w in wheels:
            unpack(os.path.join(tmp, "wheels", w), args.dest)
            print("unpacked", w)


if __name__ == "__main__":
    main()
