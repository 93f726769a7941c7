"""Device-side error reporting without a GPU: decoding of the error word, the
debug flag, the plumbing of error_word into the launch, and the host-side
validation of lengths (kv_len < q_len, non-monotonic indptrs) that runs when
the bounds are computed on the host.
"""

import os
import subprocess
import sys
import warnings

import pytest
import torch

import verify_attn
from verify_attn import attention, errors, masks


# ---------------------------------------------------------------------------
# decoding


def test_clean_word_is_no_error():
    assert errors.decode_error_word([0, -1, 0, 0]) is None
    assert errors.decode_error_word(errors.ERROR_WORD_INIT) is None


def test_kv_index_error_names_request_index_and_position():
    e = errors.decode_error_word([errors.ERR_KV_INDEX, 3, 1029, 17], device="cuda:0")
    assert isinstance(e, verify_attn.KernelInputError)
    assert isinstance(e, ValueError)
    assert (e.bits, e.request, e.value, e.position) == (1, 3, 1029, 17)
    assert e.names == ["KV_INDEX"]
    assert e.device == "cuda:0"
    msg = str(e)
    assert "cuda:0" in msg and "KV_INDEX" in msg and "0x1" in msg
    assert "request: 3" in msg and "bad KV index 1029 at KV position 17" in msg
    assert "NaN" in msg


def test_negative_index_is_reported_as_is():
    e = errors.decode_error_word([1, 0, -3, 5])
    assert e.value == -3 and "bad KV index -3 at KV position 5" in str(e)


def test_kv_len_near_int32_max_is_a_kv_index_error_without_position():
    e = errors.decode_error_word([errors.ERR_KV_INDEX, 2, 2**31 - 5, -1])
    assert (e.bits, e.request, e.value, e.position) == (1, 2, 2**31 - 5, None)
    assert "request: 2, kv_len 2147483643 too close to 2^31" in str(e) and "NaN" in str(e)


def test_several_bits():
    e = errors.decode_error_word([errors.ERR_KV_INDEX | errors.ERR_KV_SHORT | errors.ERR_QO_INDPTR, 2, 7, 1])
    assert e.names == ["KV_INDEX", "KV_SHORT", "QO_INDPTR"]
    assert "0x7" in str(e) and "kv_len < q_len" in str(e) and "qo_indptr" in str(e)
    assert e.request == 2


def test_kv_short_only():
    e = errors.decode_error_word([errors.ERR_KV_SHORT, 1, 3, -1])
    assert e.names == ["KV_SHORT"] and e.request == 1 and e.value == 3 and e.position is None
    assert "request: 1, kv_len 3 is shorter than its q_len" in str(e)


def test_qo_indptr_only():
    e = errors.decode_error_word([errors.ERR_QO_INDPTR, 0, 9, -1])
    assert e.names == ["QO_INDPTR"] and "offending value 9" in str(e) and "rows skipped" in str(e)


def test_metadata_errors():
    """va_verify_metadata's words: a prefix / row end (no position), a draft slot (its KV position)."""
    e = errors.decode_error_word([errors.ERR_METADATA, 1, -2, -1])
    assert e.names == ["METADATA"] and (e.request, e.value, e.position) == (1, -2, None)
    assert "prefix length or kv_indices end -2" in str(e) and "kv_indices entries not written" in str(e)
    e = errors.decode_error_word([errors.ERR_METADATA, 0, 2**31 - 1, 4])
    assert (e.request, e.value, e.position) == (0, 2**31 - 1, 4) and "draft slot 2147483647 outside int32" in str(e)
    assert errors.bit_names(errors.ERR_METADATA | errors.ERR_KV_INDEX) == ["KV_INDEX", "METADATA"]


def test_bits_without_request_and_unknown_bits():
    e = errors.decode_error_word([1 | 64, -1, 0, 0])
    assert e.request is None and e.value is None and e.position is None
    assert e.names == ["KV_INDEX", "0x40"]
    assert "no request recorded" in str(e) and "unknown bits 0x40" in str(e)


def test_short_word_from_a_one_int_kernel():
    """A kernel that only ORs bits into word [0] still decodes."""
    e = errors.decode_error_word([2])
    assert e.names == ["KV_SHORT"] and e.request is None


def test_exports():
    for n in ("KernelInputError", "check_errors", "set_debug", "ensure_error_buffer", "errors"):
        assert n in verify_attn.__all__ and hasattr(verify_attn, n)
    assert verify_attn.KernelInputError is errors.KernelInputError


@pytest.mark.parametrize("bad", ["cpu", torch.device("cpu"), "meta", "not-a-device"])
def test_check_errors_rejects_a_non_cuda_device(bad):
    with pytest.raises(ValueError, match="^device: expected a CUDA device"):
        verify_attn.check_errors(bad)


def test_check_errors_before_any_launch_is_a_no_op():
    errors._reset_for_tests()
    assert verify_attn.check_errors() is None


# ---------------------------------------------------------------------------
# debug flag


@pytest.mark.parametrize("value", ["false", "no", 1, 0, None])
def test_set_debug_refuses_non_bool(value):
    """set_debug("false") used to turn debug on (truthiness)."""
    before = errors.debug_enabled()
    with pytest.raises(TypeError, match=r"^enabled: expected a bool"):
        verify_attn.set_debug(value)
    assert errors.debug_enabled() == before


def test_set_debug_toggles():
    before = errors.debug_enabled()
    try:
        verify_attn.set_debug(True)
        assert errors.debug_enabled()
        verify_attn.set_debug(False)
        assert not errors.debug_enabled()
    finally:
        verify_attn.set_debug(before)


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("0", False), ("", False)])
def test_debug_env_variable(value, expected):
    env = dict(os.environ, VERIFY_ATTN_DEBUG=value)
    code = "import verify_attn; print(verify_attn.errors.debug_enabled())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected)


# ---------------------------------------------------------------------------
# plumbing: error_word reaches the C-ABI params; the debug check follows the
# launch and is skipped during capture (a fake extension; no GPU needed)


class _FakeC:
    DTYPE_FP16, DTYPE_BF16, MASK_TREE, MASK_CAUSAL, KV_FLAT, KV_PAGED = 0, 1, 0, 1, 0, 1

    class Params:
        def set(self, **fields):  # the binding's Params.set
            self.__dict__.update(fields)

    def __init__(self):
        self.launched = []
        fake = self

        class Plan:  # va_plan: created with the params, run per launch
            def __init__(self, p, *options):
                self.p = p

            def info(self):
                return {"workspace_bytes": 0}

            def run(self, *pointers):
                fake.launched.append(self.p.error_word)

        self.Plan = Plan


class _Stream:
    cuda_stream = 0


def _fake_env(monkeypatch, capturing=False):
    fake = _FakeC()
    calls = []
    monkeypatch.setattr(attention, "_load_C", lambda: fake)
    monkeypatch.setattr(attention, "_check_devices", lambda *a: None)
    monkeypatch.setattr(attention, "_is_capturing", lambda: capturing)
    monkeypatch.setattr(torch.cuda, "device", lambda d: _NullCtx())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: _Stream())
    monkeypatch.setattr(errors, "error_word_ptr", lambda d: 0x7F00_0000_1000)
    monkeypatch.setattr(errors, "check_errors", lambda d=None: calls.append(d))
    return fake, calls


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _paged_call():
    qo = torch.tensor([0, 2, 6], dtype=torch.int32)
    parents = torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32)
    out = torch.empty(6, 4, 64, dtype=torch.bfloat16)
    verify_attn.tree_attention_paged(
        torch.randn(6, 4, 64).to(torch.bfloat16), torch.randn(6, 4, 2, 64).to(torch.bfloat16),
        torch.randn(6, 4, 2, 64).to(torch.bfloat16), qo, torch.tensor([0, 2, 5], dtype=torch.int32),
        torch.tensor([4, 0, 2, 5, 1], dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32),
        tree_mask=masks.from_parents(parents, qo), max_q_len=4, max_kv_len=9, out=out)


def test_error_word_is_passed_to_every_launch(monkeypatch):
    fake, calls = _fake_env(monkeypatch)
    verify_attn.set_debug(False)
    _paged_call()
    assert fake.launched == [0x7F00_0000_1000]
    assert calls == []  # no check (and no sync) unless asked


def test_debug_checks_after_each_launch(monkeypatch):
    fake, calls = _fake_env(monkeypatch)
    try:
        verify_attn.set_debug(True)
        _paged_call()
        _paged_call()
    finally:
        verify_attn.set_debug(False)
    assert len(fake.launched) == 2 and len(calls) == 2


def test_debug_check_skipped_during_capture(monkeypatch):
    fake, calls = _fake_env(monkeypatch, capturing=True)
    try:
        verify_attn.set_debug(True)
        _paged_call()
    finally:
        verify_attn.set_debug(False)
    assert len(fake.launched) == 1 and calls == []


def test_capture_without_buffer_passes_null_and_warns_once(monkeypatch):
    errors._reset_for_tests()
    monkeypatch.setattr(errors, "_is_capturing", lambda index=None: True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert errors.error_word_ptr(torch.device("cuda", 0)) == 0
        assert errors.error_word_ptr(torch.device("cuda", 0)) == 0
    assert len([x for x in w if "error buffer" in str(x.message)]) == 1
    with pytest.raises(RuntimeError, match="during CUDA graph capture"):
        errors.ErrorState.get(0)
    errors._reset_for_tests()


def test_error_state_rejects_cpu_device():
    with pytest.raises(ValueError, match="device: expected a CUDA device"):
        errors._device_index("cpu")


# ---------------------------------------------------------------------------
# host-side validation of lengths (bounds computed on the host)

H, HKV, D = 4, 2, 64


def paged(**over):
    qo = torch.tensor([0, 2, 6], dtype=torch.int32)
    parents = torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32)
    a = dict(
        q=torch.randn(6, H, D).to(torch.bfloat16),
        k_cache=torch.randn(6, 4, HKV, D).to(torch.bfloat16),
        v_cache=torch.randn(6, 4, HKV, D).to(torch.bfloat16),
        qo_indptr=qo,
        kv_indptr=torch.tensor([0, 2, 5], dtype=torch.int32),
        kv_indices=torch.tensor([4, 0, 2, 5, 1], dtype=torch.int32),
        kv_len=torch.tensor([5, 9], dtype=torch.int32),
        tree_mask=masks.from_parents(parents, qo),
    )
    a.update(over)
    return a


def flat(**over):
    qo = torch.tensor([0, 2, 6], dtype=torch.int32)
    parents = torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32)
    a = dict(
        q=torch.randn(6, H, D).to(torch.bfloat16),
        k=torch.randn(14, HKV, D).to(torch.bfloat16),
        v=torch.randn(14, HKV, D).to(torch.bfloat16),
        qo_indptr=qo,
        kv_indptr=torch.tensor([0, 5, 14], dtype=torch.int32),
        tree_mask=masks.from_parents(parents, qo),
    )
    a.update(over)
    return a


def call(a):
    a = dict(a)
    if "k_cache" in a:
        return verify_attn.tree_attention_paged(
            a.pop("q"), a.pop("k_cache"), a.pop("v_cache"), a.pop("qo_indptr"), a.pop("kv_indptr"),
            a.pop("kv_indices"), a.pop("kv_len"), **a)
    return verify_attn.tree_attention_flat(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("qo_indptr"),
                                           a.pop("kv_indptr"), **a)


def i32(*x):
    return torch.tensor(x, dtype=torch.int32)


HOST_CASES = [
    ("paged_kv_len_short", paged(kv_len=i32(5, 3)),
     r"^kv_len: request 1 has kv_len 3 < q_len 4"),
    ("paged_too_few_pages", paged(kv_len=i32(9, 9)),
     r"^kv_len: request 0 has kv_len 9, which needs 3 pages of 4, but kv_indptr gives it 2"),
    ("paged_kv_indptr_decreasing", paged(kv_indptr=i32(0, 3, 2)),
     r"^kv_indptr: must be non-decreasing; decreasing at request 1 \(kv_indptr\[1\] = 3 > kv_indptr\[2\] = 2\)"),
    ("paged_kv_indptr_past_indices", paged(kv_indptr=i32(0, 2, 6)),
     r"^kv_indptr: last value 6 exceeds the 5 entries of kv_indices"),
    ("paged_kv_indptr_negative", paged(kv_indptr=i32(-1, 2, 5)),
     r"^kv_indptr: must start at >= 0, got kv_indptr\[0\] = -1"),
    ("qo_indptr_decreasing", paged(qo_indptr=i32(0, 7, 6)),
     r"^qo_indptr: must start at 0, be non-decreasing.*decreasing at request 1 \(qo_indptr\[1\] = 7 > qo_indptr\[2\] = 6\)"),
    ("flat_kv_rows_short", flat(kv_indptr=i32(0, 5, 8)),
     r"^kv_indptr: request 1 has 3 KV rows \(kv_indptr\[2\] - kv_indptr\[1\]\) < q_len 4"),
    ("flat_kv_indptr_past_rows", flat(kv_indptr=i32(0, 5, 15)),
     r"^kv_indptr: last value 15 exceeds the 14 rows of k"),
    ("flat_kv_indptr_decreasing", flat(kv_indptr=i32(0, 9, 5)),
     r"^kv_indptr: must be non-decreasing; decreasing at request 1"),
]


@pytest.mark.parametrize("name,args,match", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_host_length_validation(name, args, match):
    with pytest.raises(ValueError, match=match):
        call(args)


def test_host_validation_runs_when_only_max_kv_len_is_computed():
    with pytest.raises(ValueError, match=r"^kv_len: request 1 has kv_len 3 < q_len 4"):
        call(paged(kv_len=i32(5, 3), max_q_len=4))


def test_no_host_read_when_both_bounds_are_passed():
    """Bounds given: nothing is read on the host (the kernel flags it instead), so
    the CPU call reaches the device check."""
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        call(paged(kv_len=i32(5, 3), max_q_len=4, max_kv_len=9))


@pytest.mark.parametrize("layout", ["paged", "flat"])
def test_valid_lengths_pass_host_validation(layout):
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        call(paged() if layout == "paged" else flat())


def test_host_lists_one_copy_and_mixed_devices():
    a, b = i32(0, 1, 2), i32(5)
    assert attention._host_lists([a, None, b]) == [[0, 1, 2], None, [5]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
@pytest.mark.parametrize("device", [None, "cuda", "cuda:0", 0])
def test_ensure_error_buffer_without_cuda_is_a_clear_runtime_error(device):
    """Not torch's "AssertionError: Torch not compiled with CUDA enabled"."""
    with pytest.raises(RuntimeError, match=r"^verify_attn.ensure_error_buffer: needs a CUDA device"):
        verify_attn.ensure_error_buffer(device)
    assert not errors.ErrorState._states


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_ensure_error_buffer_rejects_a_non_cuda_device(device):
    with pytest.raises(ValueError, match=rf"^device: expected a CUDA device, got {device}"):
        verify_attn.ensure_error_buffer(device)
