"""Scalar arguments of the public API: checked, converted, and named in the error.

``int()``/``float()``/``bool()`` would accept ``"3"``, ``2.7`` (truncated) or
``"yes"`` and fail, when they fail, without naming the argument; these helpers
raise ``TypeError("<name>: ...")`` instead (``ValueError`` for a number that
no float can hold).
"""

import operator

try:  # numpy scalars (np.int64, np.float32, np.bool_) are accepted when numpy is present
    import numpy as _np

    _NP_BOOL = (_np.bool_,)
except ImportError:  # pragma: no cover - numpy ships with torch wheels
    _NP_BOOL = ()


def as_int(x, name: str) -> int:
    """``x`` as a Python int; bools, strings, floats and other non-integers raise TypeError."""
    if isinstance(x, (bool, str, bytes, float) + _NP_BOOL):
        raise TypeError(f"{name}: expected an integer, got {type(x).__name__} {x!r}")
    try:
        return operator.index(x)  # int, numpy integers, integer 0-d tensors
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(x).__name__} {x!r}") from None


def as_float(x, name: str) -> float:
    """``x`` as a Python float; bools, strings and non-numbers raise TypeError, a
    number beyond the float range (``10**400``) ValueError."""
    if isinstance(x, (bool, str, bytes) + _NP_BOOL):
        raise TypeError(f"{name}: expected a number, got {type(x).__name__} {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a number, got {type(x).__name__} {x!r}") from None
    except OverflowError:  # e.g. 10**400: an int beyond the float range
        raise ValueError(f"{name}: {type(x).__name__} value out of the float range") from None


def as_bool(x, name: str) -> bool:
    """``x`` if it is a bool (or a numpy bool); anything else raises TypeError."""
    if isinstance(x, bool):
        return x
    if isinstance(x, _NP_BOOL):
        return bool(x)
    raise TypeError(f"{name}: expected a bool, got {type(x).__name__} {x!r}")
