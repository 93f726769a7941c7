"""Write a binary wheel (PEP 427) from files given on the command line.

Used by the `py_wheel` rule in wheel.bzl. Produces a correct
`{dist}-{version}.dist-info/` with METADATA (core metadata 2.1), WHEEL
(Root-Is-Purelib: false, the platform tag) and RECORD (urlsafe base64 sha256
of every file, PEP 376/427), so `pip install` accepts the wheel.
"""

import argparse
import base64
import hashlib
import re
import sys
import zipfile

# Fixed timestamp: the same inputs give the same wheel bytes.
_DATE = (2020, 1, 1, 0, 0, 0)


def _record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--distribution", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--version_file", required=True,
                    help="python file defining __version__; must equal --version")
    ap.add_argument("--python_tag", required=True)
    ap.add_argument("--platform_tag", required=True)
    ap.add_argument("--summary", default="")
    ap.add_argument("--requires_python", default="")
    ap.add_argument("--requires_dist", action="append", default=[])
    ap.add_argument("--entry_points_file", default="")
    ap.add_argument("--description_file", default="")
    ap.add_argument("--file", action="append", default=[],
                    help="DEST=SRC: put SRC at DEST inside the wheel")
    args = ap.parse_args()

    text = open(args.version_file).read()
    m = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    if not m or m.group(1) != args.version:
        sys.exit("build_wheel: %s says %r but the build says %r; keep them equal"
                 % (args.version_file, m.group(1) if m else None, args.version))

    dist = args.distribution.replace("-", "_")
    info = "%s-%s.dist-info" % (dist, args.version)
    tag = "%s-%s-%s" % (args.python_tag, args.python_tag, args.platform_tag)

    metadata = ["Metadata-Version: 2.1", "Name: " + args.distribution,
                "Version: " + args.version]
    if args.summary:
        metadata.append("Summary: " + args.summary)
    if args.requires_python:
        metadata.append("Requires-Python: " + args.requires_python)
    metadata += ["Requires-Dist: " + r for r in args.requires_dist]
    body = ""
    if args.description_file:
        metadata.append("Description-Content-Type: text/markdown")
        body = "\n" + open(args.description_file).read()
    metadata_text = "\n".join(metadata) + "\n" + body

    wheel_text = "\n".join([
        "Wheel-Version: 1.0",
        "Generator: verify_attn build_wheel.py",
        "Root-Is-Purelib: false",
        "Tag: " + tag,
    ]) + "\n"

    entries = []
    for spec in args.file:
        dest, src = spec.split("=", 1)
        with open(src, "rb") as f:
            entries.append((dest, f.read(), dest.endswith(".so")))
    entries.append((info + "/METADATA", metadata_text.encode(), False))
    entries.append((info + "/WHEEL", wheel_text.encode(), False))
    if args.entry_points_file:
        with open(args.entry_points_file, "rb") as f:
            entries.append((info + "/entry_points.txt", f.read(), False))

    seen = set()
    record = []
    with zipfile.ZipFile(args.out, "w", zipfile.ZIP_DEFLATED) as zf:
        for dest, data, executable in entries:
            if dest in seen:
                sys.exit("build_wheel: %s appears twice" % dest)
            seen.add(dest)
            zi = zipfile.ZipInfo(dest, date_time=_DATE)
            zi.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
            record.append("%s,%s,%d" % (dest, _record_hash(data), len(data)))
        record.append(info + "/RECORD,,")
        zi = zipfile.ZipInfo(info + "/RECORD", date_time=_DATE)
        zi.external_attr = (0o644 | 0o100000) << 16
        zf.writestr(zi, "\n".join(record) + "\n")


if __name__ == "__main__":
    main()
