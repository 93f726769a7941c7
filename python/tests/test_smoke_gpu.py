"""GPU smoke test: the toolchain works end to end on a real device."""

import pytest
import torch

import verify_attn
from verify_attn import testing

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scaled_copy_matches_torch(dtype):
    n = 1_000_003  # not a multiple of the block size; > one grid-stride pass
    x = torch.randn(n, device="cuda", dtype=dtype)
    y = testing.scaled_copy(x, 0.37)
    torch.cuda.synchronize()
    ref = (x.double() * 0.37)
    err = ((y.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err
    assert torch.isfinite(y).all()


def test_runtime_info_on_device():
    info = verify_attn.runtime_info()
    major, minor = torch.cuda.get_device_capability()
    arch = "sm_%d%d" % (major, minor)
    assert arch + "a" in info["compiled_archs"], (arch, info)
    assert info["cuda_driver"] >= info["cuda_runtime"] // 1000 * 1000, info
    print("runtime_info:", info, torch.cuda.get_device_name())
