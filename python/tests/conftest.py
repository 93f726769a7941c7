"""pytest configuration shared by the test files."""

import importlib.util
import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (Bazel tag 'gpu')")
    # `bazel test --config=gpu` and tools/gpu_run.sh set this: GPU tests must
    # run there, not skip for lack of a device.
    if os.environ.get("VERIFY_ATTN_REQUIRE_GPU") == "1":
        import pytest
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("VERIFY_ATTN_REQUIRE_GPU=1 but torch sees no CUDA device")


@pytest.fixture
def sm90_tma_env(monkeypatch):
    """For the sm_90a TMA kernels' tests (test_tma_gpu, test_k_rows_tma_gpu: each
    module uses it for every test): skips off sm_90; clears the knobs that would
    force a configuration or refuse the rows map (VERIFY_ATTN_FORCE_CONFIG,
    VERIFY_ATTN_K_ROWS_TMA); sets VERIFY_ATTN_REQUIRE_K_TMA=1, so a planned TMA
    kernel whose K map the launch cannot encode fails instead of running the
    cp.async kernel (kernels/sm90/tma_host.h) and a passing case ran the kernel it
    planned; afterwards, nothing may be left flagged in the device error word."""
    import torch

    import verify_attn
    from verify_attn import errors

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a kernels")
    for name in ("VERIFY_ATTN_FORCE_CONFIG", "VERIFY_ATTN_K_ROWS_TMA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VERIFY_ATTN_REQUIRE_K_TMA", "1")
    errors._reset_for_tests()
    yield
    verify_attn.check_errors()


_TOOLS = {}


@pytest.fixture(scope="session")
def load_tool():
    """``load_tool("ncu_stalls")``: tools/<name>.py as a module, loaded once per
    session (its absl flags register globally), found beside the tests both in
    the repository and in Bazel's runfiles (the test target lists the file as
    data); skips the test when it is not there."""

    def load(name):
        if name not in _TOOLS:
            here = os.path.dirname(os.path.abspath(__file__))
            for base in (here, os.path.dirname(os.path.realpath(__file__))):
                path = os.path.join(os.path.dirname(os.path.dirname(base)), "tools", name + ".py")
                if os.path.exists(path):
                    spec = importlib.util.spec_from_file_location(name, path)
                    mod = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(mod)
                    _TOOLS[name] = mod
                    break
            else:
                pytest.skip(f"tools/{name}.py not found beside the tests")
        return _TOOLS[name]

    return load
