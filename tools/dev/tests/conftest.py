"""pytest configuration of the developer probes' tests (tools/dev/tests)."""

import importlib.util
import os

import pytest

_TOOLS = {}


def _tool_file(name):
    """tools/dev/<name>: in this folder's parent, both in the repository and in
    Bazel's runfiles (the test target lists the file as data); None if absent."""
    here = os.path.abspath(__file__)
    for base in (os.path.dirname(here), os.path.dirname(os.path.realpath(here))):
        path = os.path.join(os.path.dirname(base), name)
        if os.path.exists(path):
            return path
    return None


@pytest.fixture(scope="session")
def tool_path():
    """``tool_path("ab_compare.py")``: the path of a file of tools/dev/; skips the
    test when it is not there."""

    def find(name):
        path = _tool_file(name)
        if path is None:
            pytest.skip(f"tools/dev/{name} not found beside the tests")
        return path

    return find


@pytest.fixture(scope="session")
def load_tool(tool_path):
    """``load_tool("ncu_stalls")``: tools/dev/<name>.py as a module, loaded once
    per session (its absl flags register globally); skips the test when the
    file is not there."""

    def load(name):
        if name not in _TOOLS:
            spec = importlib.util.spec_from_file_location(name, tool_path(name + ".py"))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _TOOLS[name] = mod
        return _TOOLS[name]

    return load
