"""`py_wheel`: a platform wheel (cpXY-cpXY-linux_x86_64) with a compiled extension.

Bazel 4.2.3 has no wheel rule of its own (rules_python's py_wheel needs a
newer Bazel and a download), so this small rule calls build_wheel.py.
"""

def _py_wheel_impl(ctx):
    name = "%s-%s-%s-%s-%s.whl" % (
        ctx.attr.distribution.replace("-", "_"),
        ctx.attr.version,
        ctx.attr.python_tag,
        ctx.attr.python_tag,
        ctx.attr.platform_tag,
    )
    out = ctx.actions.declare_file(name)
    args = ctx.actions.args()
    args.add("--out", out)
    args.add("--distribution", ctx.attr.distribution)
    args.add("--version", ctx.attr.version)
    args.add("--version_file", ctx.file.version_file)
    args.add("--python_tag", ctx.attr.python_tag)
    args.add("--platform_tag", ctx.attr.platform_tag)
    args.add("--summary", ctx.attr.summary)
    args.add("--requires_python", ctx.attr.requires_python)
    args.add_all(ctx.attr.requires_dist, before_each = "--requires_dist")
    inputs = [ctx.file.version_file]
    if ctx.file.description_file:
        args.add("--description_file", ctx.file.description_file)
        inputs.append(ctx.file.description_file)
    if ctx.file.entry_points_file:
        args.add("--entry_points_file", ctx.file.entry_points_file)
        inputs.append(ctx.file.entry_points_file)

    strip = ctx.attr.strip_prefix
    for f in ctx.files.srcs:
        path = f.short_path
        if strip and path.startswith(strip + "/"):
            path = path[len(strip) + 1:]
        args.add("--file", "%s=%s" % (path, f.path))
        inputs.append(f)
    for target, dest in ctx.attr.extra_files.items():
        files = target.files.to_list()
        if len(files) != 1:
            fail("extra_files: %s must be one file" % target.label)
        args.add("--file", "%s=%s" % (dest, files[0].path))
        inputs.append(files[0])

    ctx.actions.run(
        executable = ctx.executable._builder,
        arguments = [args],
        inputs = inputs,
        outputs = [out],
        mnemonic = "PyWheel",
        progress_message = "Building wheel %s" % name,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

py_wheel = rule(
    implementation = _py_wheel_impl,
    attrs = {
        "distribution": attr.string(mandatory = True),
        "version": attr.string(mandatory = True),
        "version_file": attr.label(mandatory = True, allow_single_file = [".py"]),
        "python_tag": attr.string(mandatory = True),
        "platform_tag": attr.string(default = "linux_x86_64"),
        "summary": attr.string(),
        "requires_python": attr.string(),
        "requires_dist": attr.string_list(),
        "description_file": attr.label(allow_single_file = True),
        "entry_points_file": attr.label(allow_single_file = True),
        "srcs": attr.label_list(allow_files = True, doc = "files placed at their path minus strip_prefix"),
        "strip_prefix": attr.string(doc = "package path removed from srcs' paths"),
        "extra_files": attr.label_keyed_string_dict(allow_files = True, doc = "file -> path in the wheel"),
        "_builder": attr.label(
            default = Label("//tools/bazel/wheel:build_wheel"),
            executable = True,
            cfg = "exec",
        ),
    },
)
