"""Device-side input errors: the per-device error word, ``check_errors()``, debug mode.

Some inputs live on the device and are never read by the host in the hot path:
the page ids in ``kv_indices``, and (when ``max_q_len``/``max_kv_len`` are
passed) ``qo_indptr``, ``kv_indptr`` and ``kv_len``. The kernels check them as
they read them: a KV index outside the cache is never dereferenced, and the
affected request's output is not valid (NaN); the kernel records what it found
in an *error word* (``va_params.error_word``, see ``kernels/verify_attn.h``)::

    int32[4]: [0] OR of the error bits (ERR_KV_INDEX = 1, ERR_KV_SHORT = 2,
                  ERR_QO_INDPTR = 4, ERR_METADATA = 8), 0 when clean
              [1] first offending request (-1: none recorded)
              [2] the offending value (bad page id / flat row, or kv_len)
              [3] the KV position j in that request (-1 when not about a row)

The first error wins ([1..3] are written by the thread whose ``atomicCAS``
turns [1] from -1 into its request).

How the Python API uses it:

* one error buffer per CUDA device, ``int32[4]`` initialised to
  ``[0, -1, 0, 0]``, allocated lazily at the first launch on that device and
  then kept for the life of the process; every launch passes its address, so
  recording costs nothing on the host (no sync, no allocation);
* :func:`check_errors` reads it (one device->host copy, which waits for the
  work queued so far on the current stream), raises :class:`KernelInputError`
  naming the error bits, the request, the bad index and its position when
  something was flagged, and resets it;
* :func:`set_debug` (or the environment variable ``VERIFY_ATTN_DEBUG=1``) makes
  every API call check right after its launch (a host sync per call: for
  debugging). The check is skipped while a CUDA graph is being captured and
  while ``torch.compile`` traces; a captured graph still writes the error word
  on every replay, so call :func:`check_errors` after replays.

CUDA graphs: the buffer must exist before capture, since nothing may be
allocated for it during capture (a tensor from the graph's private pool would
not outlive the graph safely). It does when the call was run once eagerly
first, which is the usual warm-up before a capture; otherwise call
:func:`ensure_error_buffer` before capturing. A launch captured on a device
without a buffer passes ``error_word = NULL`` (nothing is recorded; the kernel
still does not read out of bounds) and warns once.

Streams: the buffer is shared by every stream of a device. :func:`check_errors`
orders after the current stream's work; for launches on other streams,
synchronize them first (or call it under ``torch.cuda.stream(s)``).
"""

import os
import threading
import warnings
from typing import Dict, List, Optional, Sequence

from ._args import as_bool

__all__ = [
    "ERR_KV_INDEX",
    "ERR_KV_SHORT",
    "ERR_QO_INDPTR",
    "ERR_METADATA",
    "ERROR_WORD_INIT",
    "KernelInputError",
    "ErrorState",
    "check_errors",
    "ensure_error_buffer",
    "set_debug",
    "debug_enabled",
    "decode_error_word",
]

# The bits of kernels/launch.h (ErrorBits).
ERR_KV_INDEX = 1
ERR_KV_SHORT = 2
ERR_QO_INDPTR = 4
ERR_METADATA = 8
_KNOWN_BITS = ERR_KV_INDEX | ERR_KV_SHORT | ERR_QO_INDPTR | ERR_METADATA

ERROR_WORD_INIT = (0, -1, 0, 0)

_BIT_TEXT = {
    ERR_KV_INDEX: ("KV_INDEX", "a KV index outside the cache (paged: page id outside [0, num_pages) "
                               "or a page slot past kv_indptr[i+1]; flat: row outside [0, rows); "
                               "or a device kv_len within 128 of 2^31); it was not read"),
    ERR_KV_SHORT: ("KV_SHORT", "kv_len < q_len (a request has fewer KV rows than draft tokens)"),
    ERR_QO_INDPTR: ("QO_INDPTR", "qo_indptr not within [0, total_q], decreasing, or a request "
                                 "longer than max_q_len"),
    ERR_METADATA: ("METADATA", "uniform_verify_metadata: a prefix length < 0, a draft slot outside int32, "
                               "or a request's kv_indices entries past the capacity (not written)"),
}


def bit_names(bits: int) -> List[str]:
    """Names of the set error bits, e.g. ``["KV_INDEX", "KV_SHORT"]``; unknown bits as hex."""
    names = []
    for b, (n, _) in _BIT_TEXT.items():
        if bits & b:
            names.append(n)
    rest = bits & ~_KNOWN_BITS
    if rest:
        names.append("0x%x" % rest)
    return names


class KernelInputError(ValueError):
    """A kernel found invalid device-side input (reported by :func:`check_errors`).

    Attributes:
      device (str): the device whose error word was read, e.g. ``"cuda:0"``.
      bits (int): OR of ``ERR_KV_INDEX`` / ``ERR_KV_SHORT`` / ``ERR_QO_INDPTR``
        over every launch since the last check.
      names (list[str]): the set bits by name.
      request (int or None): the first offending request (index in its batch),
        None when the kernel recorded none.
      value (int or None): the offending value (``KV_INDEX``: the page id or
        flat row that was out of range; ``KV_SHORT``: the kv_len).
      position (int or None): the KV position ``j`` within the request (None
        when the error is not about a row).
    """

    def __init__(self, message, *, device=None, bits=0, request=None, value=None, position=None):
        super().__init__(message)
        self.device = device
        self.bits = int(bits)
        self.names = bit_names(self.bits)
        self.request = request
        self.value = value
        self.position = position


def decode_error_word(words: Sequence[int], device=None) -> Optional[KernelInputError]:
    """The error described by an error word (4 host ints), or None when it is clean.

    Pure function (no device access): what :func:`check_errors` raises.

    Args:
      words: the error word's ``int32[4]`` as host ints (missing trailing
        entries are taken from ``ERROR_WORD_INIT``): ``[0]`` the OR of the
        error bits (``ERR_KV_INDEX``, ``ERR_KV_SHORT``, ``ERR_QO_INDPTR``),
        ``[1]`` the first offending request (-1: none), ``[2]`` the offending
        value (a page id / flat row, or a kv_len), ``[3]`` the KV position in
        that request (-1: not about a row); the layout of ``va_params.error_word``
        in ``kernels/verify_attn.h`` (module docstring).
      device: named in the message when given.

    Returns:
      a :class:`KernelInputError` to raise, or None for a clean word.
    """
    words = [int(w) for w in words]
    if len(words) < 4:
        words = words + list(ERROR_WORD_INIT[len(words):])
    bits, req, value, pos = words[:4]
    if bits == 0 and req < 0:
        return None
    where = " on %s" % device if device is not None else ""
    parts = []
    for b, (n, text) in _BIT_TEXT.items():
        if bits & b:
            parts.append("%s (%s)" % (n, text))
    rest = bits & ~_KNOWN_BITS
    if rest:
        parts.append("unknown bits 0x%x" % rest)
    msg = "verify_attn: the kernel flagged invalid device inputs%s: error bits 0x%x = %s" % (
        where, bits, "; ".join(parts) if parts else "none")
    if req >= 0:
        at = (" at KV position %d" % pos) if pos >= 0 else ""
        if bits == ERR_KV_INDEX and pos < 0:
            what = "kv_len %d too close to 2^31 (int32 tile arithmetic; never read)" % value
        elif bits == ERR_KV_INDEX:
            what = "bad KV index %d%s (page id or flat row; never read)" % (value, at)
        elif bits == ERR_KV_SHORT:
            what = "kv_len %d is shorter than its q_len" % value
        elif bits == ERR_METADATA and pos < 0:
            what = "prefix length or kv_indices end %d (negative, or past the capacity or 2^31)" % value
        elif bits == ERR_METADATA:
            what = "draft slot %d outside int32%s" % (value, at)
        else:
            what = "offending value %d%s" % (value, at)
        effect = {ERR_QO_INDPTR: "rows skipped", ERR_METADATA: "its kv_indices entries not written"}.get(
            bits, "its output rows are NaN")
        msg += ". First offending request: %d, %s (%s)" % (req, what, effect)
        if pos < 0:
            pos = None
    else:
        msg += ". (no request recorded)"
        req, value, pos = None, None, None
    msg += ". The error word was reset."
    return KernelInputError(msg, device=device, bits=bits, request=req, value=value, position=pos)


# ---------------------------------------------------------------------------
# per-device state


class ErrorState:
    """The error buffer of one CUDA device (``int32[4]``, see the module doc).

    Obtain with :meth:`get`; never construct during CUDA graph capture.
    """

    _states: Dict[int, "ErrorState"] = {}
    _lock = threading.Lock()
    _warned_capture = False

    def __init__(self, index: int):
        import torch

        self.index = index
        self.device = torch.device("cuda", index)
        init = torch.tensor(ERROR_WORD_INIT, dtype=torch.int32)
        with torch.cuda.device(index):
            # `init_dev` stays on the device so that a reset is one D2D copy.
            self.init_dev = init.to(self.device)
            self.buf = self.init_dev.clone()
            torch.cuda.current_stream(index).synchronize()
        self.ptr = int(self.buf.data_ptr())

    @classmethod
    def get(cls, device=None, create: bool = True) -> Optional["ErrorState"]:
        """The state of ``device`` (default: the current CUDA device).

        Creates it when missing and ``create``; raises RuntimeError when that
        would happen during CUDA graph capture.
        """
        index = _device_index(device)
        st = cls._states.get(index)
        if st is not None or not create:
            return st
        if _is_capturing(index):
            raise RuntimeError(
                "verify_attn: cannot allocate the error buffer of cuda:%d during CUDA graph capture; "
                "call verify_attn.ensure_error_buffer() (or run the call once) before capturing" % index)
        with cls._lock:
            st = cls._states.get(index)
            if st is None:
                st = cls(index)
                cls._states[index] = st
        return st

    def read(self) -> List[int]:
        """The 4 words (one device->host copy after the current stream's work)."""
        return [int(x) for x in self.buf.tolist()]

    def reset(self) -> None:
        """Back to ``[0, -1, 0, 0]`` (stream-ordered on the current stream)."""
        self.buf.copy_(self.init_dev)

    def check(self, reset: bool = True) -> None:
        words = self.read()
        err = decode_error_word(words, device=str(self.device))
        if err is None:
            return
        if reset:
            self.reset()
        raise err


def _device_index(device) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError("device: expected a CUDA device, got %s" % d)
    return d.index if d.index is not None else torch.cuda.current_device()


def _is_capturing(index=None) -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        return torch.cuda.is_current_stream_capturing()
    except Exception:  # pragma: no cover
        return False


def error_word_ptr(device) -> int:
    """Address to pass as ``error_word`` for a launch on ``device`` (internal).

    Allocates the buffer on first use outside capture; during capture without a
    buffer returns 0 (NULL: nothing recorded) and warns once.
    """
    index = getattr(device, "index", None)  # hot path: q.device of a CUDA tensor
    if index is None:
        index = _device_index(device)
    st = ErrorState._states.get(index)
    if st is not None:
        return st.ptr
    if _is_capturing(index):
        if not ErrorState._warned_capture:
            ErrorState._warned_capture = True
            warnings.warn(
                "verify_attn: a launch on cuda:%d is being captured before its error buffer exists; "
                "device-side input errors of this graph are not recorded. Call "
                "verify_attn.ensure_error_buffer() (or run the call once eagerly) before capture." % index,
                RuntimeWarning, stacklevel=3)
        return 0
    return ErrorState.get(index).ptr


def ensure_error_buffer(device=None) -> None:
    """Allocate ``device``'s error buffer now (before a CUDA graph capture).

    Raises:
      ValueError: ``device`` is not a CUDA device.
      RuntimeError: no CUDA device is available (the buffer lives on one), or
        called during CUDA graph capture.
    """
    import torch

    _check_device_arg(device)  # a non-CUDA device is a ValueError, before the availability check
    if not torch.cuda.is_available():
        raise RuntimeError(
            "verify_attn.ensure_error_buffer: needs a CUDA device (torch.cuda.is_available() is False; "
            "torch %s, built with CUDA %s)" % (torch.__version__, torch.version.cuda))
    ErrorState.get(device, create=True)


def _check_device_arg(device) -> None:
    """``device`` (None, an index, or anything ``torch.device`` takes) must name a
    CUDA device: ValueError naming it otherwise (no CUDA needed to say so)."""
    if device is None or isinstance(device, int):
        return
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError("device: expected a CUDA device, got %r (%s)" % (device, e)) from None
    if d.type != "cuda":
        raise ValueError("device: expected a CUDA device, got %s" % d)


def check_errors(device=None) -> None:
    """Raise :class:`KernelInputError` if a kernel on ``device`` flagged bad input since the last check.

    ``device``: a CUDA device (``torch.device``, string or index; default the
    current one). Reads the device's error word (one host sync: waits for the
    work queued on the current stream), resets it when it was not clean, and
    raises naming the error bits, the first offending request, the bad index
    value and its position. Returns None when no error was recorded (or nothing
    was ever launched on that device). Cheap: one 16-byte copy.

    Raises:
      KernelInputError (a ValueError): something was flagged.
      ValueError: ``device`` is not a CUDA device (checked even before any launch).
      RuntimeError: called while the current stream is capturing a CUDA graph.
    """
    _check_device_arg(device)
    if not ErrorState._states:
        return None  # nothing was ever launched (also: no CUDA at all)
    index = _device_index(device)
    if _is_capturing(index):
        raise RuntimeError("verify_attn.check_errors: cannot read the error word during CUDA graph capture")
    st = ErrorState.get(index, create=False)
    if st is None:
        return None
    st.check(reset=True)
    return None


# ---------------------------------------------------------------------------
# debug mode

_debug = os.environ.get("VERIFY_ATTN_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def set_debug(enabled: bool = True) -> None:
    """Check for device-side input errors right after every API call (a host sync per call).

    Also enabled by the environment variable ``VERIFY_ATTN_DEBUG=1`` at import.
    Skipped during CUDA graph capture and ``torch.compile`` tracing.

    Raises:
      TypeError: ``enabled`` not a bool (``set_debug("false")`` would otherwise
      turn it on).
    """
    global _debug
    _debug = as_bool(enabled, "enabled")


def debug_enabled() -> bool:
    """Whether :func:`set_debug` (or ``VERIFY_ATTN_DEBUG``) is on."""
    return _debug


def _reset_for_tests() -> None:  # pragma: no cover - test helper
    ErrorState._states.clear()
    ErrorState._warned_capture = False
