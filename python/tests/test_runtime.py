"""CPU tests of the compiled extension: it imports without a GPU, reports the
build, says "no CUDA device" clearly, and the C-ABI rejects bad arguments
with the right status (mapped to the right Python exception)."""

import re

import pytest

import verify_attn
from verify_attn import _ext


def C():
    return _ext.load()


def test_version_is_pep440():
    assert re.fullmatch(r"\d+\.\d+\.\d+([a-z]+\d+)?", verify_attn.__version__)


def test_extension_imports_and_reports_build():
    info = verify_attn.runtime_info()
    assert info["version"] == verify_attn.__version__
    assert info["abi_version"] == C().ABI_VERSION == 7
    # Linked statically against the CUDA 13.0 runtime from the pinned wheels.
    assert 13000 <= info["cuda_runtime"] < 13010, info
    assert set(info["compiled_archs"]) <= {"sm_90a", "sm_120a"}
    assert info["compiled_archs"], info
    tags = info["config_tags"]  # the plan's table (va_config_tags)
    assert tags[0] == "mla_m32n32_s1" and "mla_wgmma_seesaw_tma" in tags and len(set(tags)) == len(tags), tags


def _has_gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU error path")
def test_no_device_is_a_clear_error():
    # Non-NULL dummy pointers: validation passes, then the device lookup fails
    # before anything is launched or dereferenced.
    with pytest.raises(RuntimeError, match="VA_ERR_NO_DEVICE.*no CUDA device"):
        C().scaled_copy(256, 512, 16, 2.0, C().DTYPE_BF16, 0)


def test_smoke_bad_dtype_is_type_error():
    with pytest.raises(TypeError, match="VA_ERR_INVALID_DTYPE: dtype"):
        C().scaled_copy(256, 512, 16, 2.0, 7, 0)


def test_smoke_null_pointer_is_value_error():
    with pytest.raises(ValueError, match="VA_ERR_NULL_POINTER: x: NULL"):
        C().scaled_copy(0, 512, 16, 2.0, C().DTYPE_BF16, 0)
    with pytest.raises(ValueError, match="VA_ERR_NULL_POINTER: y: NULL"):
        C().scaled_copy(256, 0, 16, 2.0, C().DTYPE_BF16, 0)


def test_smoke_negative_length_is_value_error():
    with pytest.raises(ValueError, match="VA_ERR_INVALID_VALUE: n: must be >= 0"):
        C().scaled_copy(256, 512, -1, 2.0, C().DTYPE_FP16, 0)


def test_params_set_in_one_call():
    p = C().Params()
    p.set(q=0xDEADBEE0, sm_scale=0.25, total_q=7, kv_len=0x1000, stream=0)
    assert (p.q, p.sm_scale, p.total_q, p.kv_len, p.stream) == (0xDEADBEE0, 0.25, 7, 0x1000, 0)
    assert p.abi_version == C().ABI_VERSION  # untouched fields keep their defaults
    with pytest.raises(AttributeError, match="no field .not_a_field."):
        p.set(not_a_field=1)
    with pytest.raises(TypeError, match="^Params.total_q: cannot take a str"):
        p.set(total_q="seven")


def test_params_roundtrip_and_defaults():
    p = C().Params()
    assert p.abi_version == C().ABI_VERSION
    assert p.struct_size > 0
    p.q = 0xDEADBEE0
    assert p.q == 0xDEADBEE0
    p.sm_scale = 0.125
    assert p.sm_scale == 0.125


def test_status_names():
    assert C().status_name(0) == "VA_OK"
    assert C().status_name(8) == "VA_ERR_NO_DEVICE"


def test_scaled_copy_python_validation():
    torch = pytest.importorskip("torch")
    from verify_attn import testing

    with pytest.raises(TypeError, match="x: dtype"):
        testing.scaled_copy(torch.zeros(4), 2.0)
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        testing.scaled_copy(torch.zeros(4, dtype=torch.bfloat16), 2.0)
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        testing.scaled_copy([1.0], 2.0)
    # a test helper, not the API: not in the top-level namespace
    assert not hasattr(verify_attn, "scaled_copy") and "scaled_copy" not in verify_attn.__all__


@pytest.mark.parametrize("layout", ["paged4d", "paged3d", "flat"])
@pytest.mark.parametrize("mla", [True, False])
def test_build_params_sets_every_field_in_one_call(layout, mla):
    # The real extension's Params from attention._build_params (CPU tensors:
    # it reads shapes, strides and addresses only): each field as the layout says.
    import torch

    from verify_attn import attention

    H, Hkv, D = (16, 1, 576) if mla else (8, 2, 64)
    q = torch.empty(6, H, D, dtype=torch.bfloat16)
    qo, kvp = torch.tensor([0, 2, 6], dtype=torch.int32), torch.tensor([0, 3, 8], dtype=torch.int32)
    kvi, kvl = torch.arange(8, dtype=torch.int32), torch.tensor([40, 90], dtype=torch.int32)
    tree = torch.zeros(6, 1, dtype=torch.int32)
    if layout == "paged4d":
        k = torch.empty(9, 16, Hkv, D, dtype=torch.bfloat16)
    else:
        k = torch.empty(144, Hkv, D, dtype=torch.bfloat16)
    v = None if mla else torch.empty_like(k)
    dvo = 512 if mla else D
    out = torch.empty(6, H, dvo, dtype=torch.bfloat16)
    lse = torch.empty(6, H, dtype=torch.float32)
    kv_layout = attention._KV_FLAT if layout == "flat" else attention._KV_PAGED
    p = attention._build_params(C(), q, k, v, qo, kvp, kvi, kvl, tree, kv_layout, 16, False, 0.1, dvo, 2, 90, 3,
                                out, lse, overrides={"stream": 0x40, "error_word": 0x80})
    assert (p.dtype, p.batch_size, p.total_q, p.max_q_len, p.max_kv_len) == (C().DTYPE_BF16, 2, 6, 2, 90)
    assert (p.num_qo_heads, p.num_kv_heads, p.head_dim_qk, p.head_dim_vo) == (H, Hkv, D, dvo)
    assert abs(p.sm_scale - 0.1) < 1e-7 and p.num_splits == 3 and p.v_is_k_prefix == int(mla)
    assert (p.q, p.q_stride_token, p.q_stride_head) == (q.data_ptr(), H * D, D)
    assert (p.out, p.out_stride_token, p.out_stride_head) == (out.data_ptr(), H * dvo, dvo)
    assert (p.lse, p.lse_stride_token, p.lse_stride_head) == (lse.data_ptr(), H, 1)
    assert (p.qo_indptr, p.kv_indptr, p.tree_mask, p.mask_words) == (qo.data_ptr(), kvp.data_ptr(), tree.data_ptr(), 1)
    assert (p.stream, p.error_word) == (0x40, 0x80)
    assert p.k == k.data_ptr() and p.v == (k if mla else v).data_ptr()
    if layout == "flat":
        assert (p.kv_layout, p.num_kv_rows, p.k_stride_page, p.k_stride_token) == (C().KV_FLAT, 144, 0, Hkv * D)
    else:
        assert (p.kv_layout, p.page_size, p.num_pages) == (C().KV_PAGED, 16, 9)
        assert (p.k_stride_page, p.k_stride_token, p.k_stride_head) == (16 * Hkv * D, Hkv * D, D)
        assert (p.kv_indices, p.kv_len) == (kvi.data_ptr(), kvl.data_ptr())
