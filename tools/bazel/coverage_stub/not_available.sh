#!/bin/sh
echo "verify_attn: bazel coverage is not supported (remote_coverage_tools is a stub)" >&2
exit 1
