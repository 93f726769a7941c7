"""`cuda_library`: compile .cu files with the hermetic nvcc (@cuda) into a cc_library.

Bazel 4.2.3 has no CUDA support and bazel-contrib/rules_cuda needs Bazel >= 6,
so this is our own, deliberately small rule:

  * `_cuda_objects` runs nvcc once per .cu file (`-c`, whole-program mode, the
    device code embedded as a fat binary in the host object), with
    `-ccbin` = the C++ toolchain's compiler, the include paths of its `deps`,
    and `-gencode` flags for every arch of the `--//tools/bazel/cuda:archs`
    build setting (see .bazelrc: --config=sm90, --config=sm120; default both).
  * `cuda_library` wraps those objects in a native cc_library that links the
    static CUDA runtime, so cc_library / cc_binary targets can depend on it.
  * An nvcc action fails if ptxas reports that it serialized a kernel's
    warpgroup MMAs (C751x: the sm_90a kernels would lose their overlap).

The action's PATH is pinned to /usr/bin:/bin so no CUDA installed on the
machine (a system nvcc or toolkit) can ever be picked up; nvcc
finds cicc, ptxas and fatbinary through its own nvcc.profile, relative to
itself inside @cuda.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

CudaArchsInfo = provider(
    doc = "The GPU architectures to compile for.",
    fields = {"archs": "list of strings like 'sm_90a'"},
)

_KNOWN_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120", "sm_120a"]

def _cuda_archs_flag_impl(ctx):
    archs = [a.strip() for a in ctx.build_setting_value.split(",") if a.strip()]
    if not archs:
        fail("%s: at least one CUDA arch is needed" % ctx.label)
    for a in archs:
        if a not in _KNOWN_ARCHS:
            fail("%s: unknown CUDA arch '%s' (known: %s)" % (ctx.label, a, ", ".join(_KNOWN_ARCHS)))
    return [CudaArchsInfo(archs = archs)]

cuda_archs_flag = rule(
    implementation = _cuda_archs_flag_impl,
    build_setting = config.string(flag = True),
    doc = "Comma-separated CUDA archs, e.g. 'sm_90a,sm_120a'.",
)

# run_shell's arguments: $1 = nvcc, the rest its arguments.
_NVCC_CHECKED = """nvcc="$1"; shift
log="$("$nvcc" "$@" 2>&1)"; rc=$?
[ -n "$log" ] && printf '%s\\n' "$log" >&2
[ "$rc" -ne 0 ] && exit "$rc"
if printf '%s' "$log" | grep -q 'instructions are serialized'; then
  echo 'nvcc: ptxas serialized warpgroup MMAs (the C751x lines above): fix the kernel' >&2
  exit 1
fi
exit 0"""

def _gencode(arch):
    num = arch[len("sm_"):]
    return "-gencode=arch=compute_%s,code=sm_%s" % (num, num)

def _cuda_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    archs = ctx.attr._archs[CudaArchsInfo].archs
    cc_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    cctx = cc_info.compilation_context
    nvcc = ctx.file._nvcc

    objs = []
    for src in ctx.files.srcs:
        stem = src.basename[:-len(src.extension) - 1]
        obj = ctx.actions.declare_file("_objs/%s/%s.o" % (ctx.label.name, stem))
        args = ctx.actions.args()
        args.add("-ccbin", cc_toolchain.compiler_executable)
        args.add_all(["-x", "cu", "-std=c++17", "-O3", "-Xcompiler", "-fPIC"])
        args.add("--objdir-as-tempdir")  # temporaries next to the output: no collisions
        args.add_all(["-Xptxas", "-warn-spills"])
        args.add_all([_gencode(a) for a in archs])
        args.add("-DVERIFY_ATTN_CUDA_ARCHS=\"%s\"" % ",".join(archs))
        args.add_all(cctx.defines, format_each = "-D%s")
        args.add_all(cctx.quote_includes, format_each = "-I%s")
        args.add_all(cctx.includes, format_each = "-I%s")
        args.add_all(cctx.system_includes, before_each = "-isystem")
        args.add_all(ctx.attr.copts)
        args.add("-c", src)
        args.add("-o", obj)
        # nvcc's own output is passed on; ptxas serializing a kernel's warpgroup
        # MMAs (C7510-C7515, "wgmma.mma_async instructions are serialized") is
        # only an info line but costs a wgmma kernel its overlap: fail instead.
        ctx.actions.run_shell(
            command = _NVCC_CHECKED,
            arguments = [nvcc.path, args],
            tools = [nvcc],
            inputs = depset(
                [src],
                transitive = [cctx.headers, ctx.attr._toolkit.files, cc_toolchain.all_files],
            ),
            outputs = [obj],
            env = {"PATH": "/usr/bin:/bin"},
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s (%s)" % (src.short_path, ",".join(archs)),
        )
        objs.append(obj)
    return [DefaultInfo(files = depset(objs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "_nvcc": attr.label(
            default = Label("@cuda//:nvcc"),
            allow_single_file = True,
            executable = True,
            cfg = "exec",
        ),
        "_toolkit": attr.label(default = Label("@cuda//:compiler_files")),
        "_archs": attr.label(default = Label("//tools/bazel/cuda:archs")),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose .cu sources are compiled by the hermetic nvcc.

    Args:
      name: target name; `name` is a cc_library others can depend on.
      srcs: .cu files.
      hdrs: headers exported to dependents.
      deps: cc_library dependencies (their headers are visible to nvcc).
      copts: extra nvcc flags.
      visibility: as for cc_library.
      **kwargs: passed to the cc_library.
    """
    _cuda_objects(
        name = name + "_cuda_objects",
        srcs = srcs,
        deps = deps + ["@cuda//:cuda_headers"],
        copts = copts,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cuda_objects"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart_static"],
        alwayslink = True,
        linkstatic = True,
        visibility = visibility,
        **kwargs
    )

def _cuda_archs_string_impl(ctx):
    archs = ctx.attr._archs[CudaArchsInfo].archs
    return [platform_common.TemplateVariableInfo({"ARCHS": ",".join(archs)})]

cuda_archs_string = rule(
    implementation = _cuda_archs_string_impl,
    attrs = {"_archs": attr.label(default = Label("//tools/bazel/cuda:archs"))},
    doc = "Make variable $(ARCHS): the configured CUDA archs, comma-separated.",
)
