"""Runs pytest on the test files given as arguments (the py_test entry point
of the `pytest_test` macro in pytest.bzl). Exits with pytest's status."""

import sys

import pytest

if __name__ == "__main__":
    sys.exit(pytest.main(["-p", "no:cacheprovider", "-ra"] + sys.argv[1:]))
