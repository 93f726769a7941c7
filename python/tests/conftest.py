"""pytest configuration shared by the test files."""

import os


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (Bazel tag 'gpu')")
    # `bazel test --config=gpu` and tools/gpu_run.sh set this: GPU tests must
    # run there, not skip for lack of a device.
    if os.environ.get("VERIFY_ATTN_REQUIRE_GPU") == "1":
        import pytest
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("VERIFY_ATTN_REQUIRE_GPU=1 but torch sees no CUDA device")
