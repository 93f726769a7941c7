"""GPU tests of a pair of splits (kernels/core/pair_combine.cuh): two splits of a row tile run
as one thread-block cluster whose CTAs combine their rows in distributed shared memory, with no
workspace and no merge kernel (the 16-row GQA warp-role kernels on sm_90 and newer).

* two splits forced on the 16-row warp-role kernels (head_dim 64 and 128, two and three
  stages), paged (page_size 1 and 16) and flat, bf16 and fp16, ragged batches whose short
  requests leave the second split without a KV tile and whose row tiles have fewer rows than
  the CTA (consumer warps without rows): the plan needs no workspace, and the result matches
  the float64 reference, as the plans with the pair off and with three splits (fp32 partial rows
  and the merge kernel) do;
* a bad page id, and a device kv_len < q_len, in one request: flagged, that request's rows
  NaN, the other requests exact.

Problems, run, reference and checks: verify_attn.testing.
"""

import random

import pytest
import torch

from verify_attn import testing
from verify_attn.testing import new_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 9,
                       reason="thread-block clusters need sm_90 or newer"),
]
DEV = "cuda"
GQA128 = testing.Model(mla=False, heads=8, kv_heads=2, d_qk=128, d_vo=128)
GQA64 = testing.Model(mla=False, heads=9, kv_heads=3, d_qk=64, d_vo=64)
CONFIGS = {
    "roles_m128_d128": (testing.ROLES_GQA[128], GQA128),
    "roles_m128_d128_s3": (testing.ROLES_S3_GQA[128], GQA128),
    "roles_m128_d64": (testing.ROLES_GQA[64], GQA64),
}


def ragged(seed, model, layout="paged", page_size=1, dtype=torch.bfloat16):
    """3-6 requests, random trees: prefixes 0-3,000 (one of 0-40 rows, whose second split has no
    KV tile), draft counts 1-40 (rows per KV head from 3 to 160: one or two row tiles, the
    second partly empty)."""
    rng = random.Random(seed)
    b = rng.randint(3, 6)
    prefixes = [rng.randint(0, 3000) for _ in range(b)]
    prefixes[rng.randrange(b)] = rng.randint(0, 40)
    q_lens = [rng.randint(1, 40) for _ in range(b)]
    return testing.make_problem(q_lens, prefixes, model=model, dtype=dtype, layout=layout, page_size=page_size,
                                tree="random", poison=False, seed=seed, device=DEV)


def _forced(tag, p):
    if tag == testing.ROLES_S3_GQA[128] and not testing.plan_info(p, num_splits=2)["name"].endswith(tag):
        pytest.skip(f"{tag} does not fit this device's shared memory")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout,page_size", [("paged", 1), ("paged", 16), ("flat", None)],
                         ids=["page1", "page16", "flat"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_pair_matches_reference(config, layout, page_size, dtype):
    tag, model = CONFIGS[config]
    seed = new_seed()
    p = ragged(seed, model, layout=layout, page_size=page_size or 1, dtype=dtype)
    with testing.kernel_path(testing.KernelPath(config=tag)):
        _forced(tag, p)
        info = testing.plan_info(p, num_splits=2)
        assert info["name"].endswith(tag) and info["num_splits"] == 2 and info["pair_splits"], info
        assert info["workspace_bytes"] == 0, info
        ref = testing.reference(p)
        out, lse = testing.run(p, num_splits=2)
        testing.check(p, out, lse, ref=ref, label=f"[seed {seed}] pair")
        info3 = testing.plan_info(p, num_splits=3)
        assert not info3["pair_splits"] and info3["workspace_bytes"] > 0, info3
        out3, lse3 = testing.run(p, num_splits=3)
        testing.check(p, out3, lse3, ref=ref, label=f"[seed {seed}] three splits, merged")
    with testing.kernel_path(testing.KernelPath(config=tag, pair_splits=False)):
        info = testing.plan_info(p, num_splits=2)
        assert not info["pair_splits"] and info["workspace_bytes"] > 0, info
        out2, lse2 = testing.run(p, num_splits=2)
        testing.check(p, out2, lse2, ref=ref, label=f"[seed {seed}] two splits, merged")


@pytest.mark.parametrize("bad", ["page_id_split0", "page_id_split1", "kv_short"])
def test_bad_request_in_a_pair(bad, clean_errors):
    """Request 1's bad page id in its first or its second split's KV range: the CTA that meets
    it sends or combines a NaN state; either way the request's rows are NaN."""
    seed = new_seed()
    tag = testing.ROLES_GQA[128]
    p = testing.make_problem([16, 12, 9], [200, 4000, 700], model=GQA128, layout="paged", page_size=1,
                             tree="random", poison=False, seed=seed, device=DEV)
    ref = testing.reference(p)[0]
    row = 500 if bad == "page_id_split0" else 3500
    q, bit = testing.bad_request(p, "kv_short" if bad == "kv_short" else "page_id", kv_row=row)
    with testing.kernel_path(testing.KernelPath(config=tag)):
        info = testing.plan_info(q, num_splits=2)
        assert info["pair_splits"] and info["workspace_bytes"] == 0, info
        out, _ = testing.run(q, num_splits=2)
    testing.check_bad_request(p, out, ref, bit, label=f"[seed {seed}] {bad}")
