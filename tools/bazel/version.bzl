"""The package version as Bazel sees it (wheel file name).

python/verify_attn/_version.py holds the same string; the wheel build fails
if they differ.
"""

VERSION = "0.1.0"
