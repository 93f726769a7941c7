"""`pytest_test`: a py_test that runs its test files under pytest."""

def pytest_test(name, srcs, deps = [], data = [], args = [], tags = [], conftest = "tests/conftest.py", **kwargs):
    """py_test running pytest over `srcs`.

    Tag GPU tests with "gpu": .bazelrc skips them unless --config=gpu.
    """
    native.py_test(
        name = name,
        srcs = srcs + ["//tools/bazel:pytest_main.py"],
        main = "//tools/bazel:pytest_main.py",
        args = ["$(rootpath %s)" % s for s in srcs] + args,
        deps = deps,
        data = data + ([conftest] if conftest else []),
        tags = tags,
        python_version = "PY3",
        **kwargs
    )
