"""pytest configuration shared by the test files (markers only)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (Bazel tag 'gpu')")
