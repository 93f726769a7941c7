"""Loading the compiled extension `verify_attn._C` lazily, with a clear error.

`import verify_attn` never fails because of the extension: the mask builders,
the reference and argument validation work without it (and without a GPU).
Functions that launch kernels call `load()`.
"""

import importlib

_module = None
_error = None


def load():
    """Return the `verify_attn._C` module, or raise ImportError saying why not."""
    global _module, _error
    if _module is not None:
        return _module
    if _error is None:
        try:
            _module = importlib.import_module("verify_attn._C")
            return _module
        except ImportError as e:  # pragma: no cover - depends on the install
            _error = e
    raise ImportError(
        "verify_attn: the compiled extension verify_attn._C could not be loaded "
        "(build/install the wheel: bazel build //python:wheel): %s" % _error
    ) from _error


def available():
    """True when the compiled extension loads."""
    try:
        load()
        return True
    except ImportError:
        return False
