"""pytest configuration shared by the test files."""

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
def kernel_path():
    """``kernel_path("mma_sync", grid_order="rows")``: the rest of the test runs on
    that kernel path (verify_attn.testing.kernel_path, the one place that selects
    one; PATHS lists the names), undone at teardown. Calls nest: a later one
    without a name refines the path in force."""
    import contextlib

    from verify_attn import testing

    with contextlib.ExitStack() as stack:
        yield lambda path=None, **fields: stack.enter_context(testing.kernel_path(path, **fields))


@pytest.fixture
def sm90_tma_env():
    """For the sm_90a MLA kernels' tests (pytest.mark.usefixtures("sm90_tma_env")):
    skips off sm_90; runs the test on the plan's own kernel path (the plan
    decides every kernel and map, and a launch never falls back to another, so a
    passing case ran the kernel plan_info names; a ``testing.kernel_path(...)``
    inside refines it); afterwards, nothing may be left flagged in the device
    error word."""
    import torch

    import verify_attn
    from verify_attn import errors, testing

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a kernels")
    with testing.kernel_path("auto"):
        errors._reset_for_tests()
        yield
        verify_attn.check_errors()


@pytest.fixture
def clean_errors():
    """For a test that flags bad device inputs on purpose: the device error word
    starts clean (raises if an earlier test left an error), and what the test
    left flagged is cleared afterwards."""
    import verify_attn

    verify_attn.set_debug(False)
    verify_attn.check_errors()
    yield
    try:
        verify_attn.check_errors()
    except verify_attn.KernelInputError:
        pass
