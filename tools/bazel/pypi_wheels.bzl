"""`pypi_wheels`: an external repository assembled from pinned PyPI wheels.

The wheels are named by package and version and pinned by sha256; pip fetches
them from whatever package index pip is configured for (see fetch_wheels.py).
Their contents are unpacked side by side into the repository root, so the
CUDA 13 wheels (nvcc, crt, nvvm, runtime, cccl) merge into one toolkit tree
under nvidia/cu13/ exactly as a CUDA installation would lay it out.
"""

def _pypi_wheels_impl(rctx):
    python = rctx.which("python3")
    if python == None:
        fail("pypi_wheels: python3 (with pip) is needed on PATH to fetch wheels")
    script = rctx.path(Label("//tools/bazel:fetch_wheels.py"))
    pins = ["%s:%s" % (spec, sha) for spec, sha in rctx.attr.packages.items()]
    res = rctx.execute(
        [python, script, "--dest", "."] + pins,
        timeout = 1800,
        quiet = False,
    )
    if res.return_code != 0:
        fail("pypi_wheels(%s): fetching %s failed:\n%s\n%s" % (
            rctx.name,
            ", ".join(rctx.attr.packages.keys()),
            res.stdout,
            res.stderr,
        ))
    rctx.symlink(rctx.attr.build_file, "BUILD.bazel")
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)

pypi_wheels = repository_rule(
    implementation = _pypi_wheels_impl,
    attrs = {
        "packages": attr.string_dict(
            mandatory = True,
            doc = "name==version -> sha256 of the wheel",
        ),
        "build_file": attr.label(mandatory = True, allow_single_file = True),
    },
)
