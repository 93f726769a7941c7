"""GPU tests of the verify_attn SGLang backend against SGLang 0.5.23's own code.

Uses SGLang's attention unit-test kit (``sglang/test/kits/attention_unittest/``:
its MLA and dense fixtures build a real ``ModelRunner`` stand-in, KV pools,
``ForwardBatch``, ``RadixAttention`` layers and ``EagleVerifyInput``s, and its
fp32 reference), for an MLA (absorbed 576/512, 16 heads) and a GQA (8 query /
2 KV heads, head dim 128) configuration, bf16, page_size 1 and 16, top-k 1
and top-k > 1:

1. ``test_kit_target_verify``: the kit's own runner
   (``run_mla_eagle_verify_case`` / ``run_dense_spec_verify_case``) with
   backend ``verify_attn`` -- the kit asserts against its reference. The kit's
   tree is hardcoded (3 drafts, parents -1, 0, 0), so top-k > 1 uses it.
2. ``test_kit_target_verify_cuda_graph``: the kit's capture/replay runner
   (``..._cuda_graph_case``) with backend ``verify_attn``, its eager leg's
   prefix write fixed (``kit_compat.py``: the kit wrote the graph fixture's
   prefix K/V at slots its ``req_to_token`` does not point to).
3. ``test_vs_triton``: the same fixtures built once for ``verify_attn`` and once
   for ``triton`` (identical seeds, weights, inputs, scattered slots), a random
   top-k 4 draft tree of 16 tokens (and a chain), SGLang's FULL mask handed to
   the Triton backend and the QLEN_ONLY mask (written into our backend's own
   ``verify_mask`` buffer, as EAGLE's tree builder does) to ours, plus ours fed
   the FULL mask (a producer that still builds it); outputs compared with each
   other and with the kit's reference; worst errors printed (``VA_WORST`` lines).
4. ``test_fp8_pool_vs_triton`` / ``test_fp8_mla_pool_vs_triton``: GQA on a
   float8_e4m3fn pool with a layer's k_scale / v_scale, MLA on the kit's own
   fp8 pool; ours against an fp32 computation over the dequantized pool and
   against Triton on the same pool.

Run: ``integration/sglang/run_gpu_tests.sh`` on the H200 (stages nothing itself).
"""

import itertools
import os
import random
import sys
import unittest

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kit_compat  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ATOL = RTOL = 3e-2  # the kit's MLA_ATOL / DENSE_ATOL
PAGE_SIZES = (1, 16)
MAX_CTX = 128
DTYPE = torch.bfloat16


def _kit():
    import verify_attn_sglang

    verify_attn_sglang.register()
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention as dense
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention as mla
    from sglang.test.kits.attention_unittest.runner_modes import speculative_target_verify_runner as tv

    return dict(ForwardMode=ForwardMode, CaptureHiddenMode=CaptureHiddenMode, ForwardContext=ForwardContext,
                forward_context=forward_context, EagleVerifyInput=EagleVerifyInput, dense=dense, mla=mla, tv=tv)


class _TC(unittest.TestCase):
    def runTest(self):  # pragma: no cover
        pass


def _case(k, arch, backend, page_size, n, name, prefix_lens=(5, 37)):
    FM = k["ForwardMode"].TARGET_VERIFY
    if arch == "mla":
        return k["mla"].MLAAttentionCase(name=name, backend=backend, forward_mode=FM, num_heads=16,
                                         page_size=page_size, prefix_lens=prefix_lens,
                                         extend_lens=(n,) * len(prefix_lens))
    return k["dense"].DenseAttentionCase(name=name, backend=backend, forward_mode=FM, num_heads=8,
                                         num_kv_heads=2, page_size=page_size, prefix_lens=prefix_lens,
                                         extend_lens=(n,) * len(prefix_lens))


MLA_KW = dict(kv_lora_rank=512, qk_rope_head_dim=64, hidden_size=256, max_context_len=MAX_CTX, dtype=DTYPE)
GQA_KW = dict(head_dim=128, hidden_size=256, max_context_len=MAX_CTX, dtype=DTYPE)

CONFIGS = list(itertools.product(("mla", "gqa"), (1, 4), PAGE_SIZES))


@pytest.mark.parametrize("arch,topk,page_size", CONFIGS)
def test_kit_target_verify(arch, topk, page_size):
    k = _kit()
    n = 4 if topk == 1 else 3  # the kit's tree is hardcoded to 3 drafts
    case = _case(k, arch, "verify_attn", page_size, n, f"va_kit_{arch}_k{topk}_p{page_size}")
    if arch == "mla":
        k["tv"].run_mla_eagle_verify_case(_TC(), case, topk=topk, **MLA_KW)
    else:
        k["tv"].run_dense_spec_verify_case(_TC(), case, topk=topk, **GQA_KW)


@pytest.mark.parametrize("arch,topk,page_size", CONFIGS)
def test_kit_target_verify_cuda_graph(arch, topk, page_size, monkeypatch):
    k = _kit()
    # The kit's eager leg on the graph fixture re-writes the prefix K/V at the
    # contiguous slots while req_to_token holds the shuffled ones (a kit bug that
    # fails Triton as well); kit_compat's docstring has the details and
    # test_plugin_cpu.py::test_kit_graph_fixture_* the CPU reproduction.
    kit_compat.patch_target_verify_runner(monkeypatch, k["tv"])
    n = 4 if topk == 1 else 3
    case = _case(k, arch, "verify_attn", page_size, n, f"va_cg_{arch}_k{topk}_p{page_size}")
    if arch == "mla":
        k["tv"].run_mla_eagle_verify_cuda_graph_case(_TC(), case, topk=topk, **MLA_KW)
    else:
        k["tv"].run_dense_spec_verify_cuda_graph_case(_TC(), case, topk=topk, **GQA_KW)


# The kit-bug claim above, checked with SGLang's own Triton backend: the same
# capture/replay case fails unpatched (wrong prefix rows, so Triton's output
# misses the kit's reference) and passes with kit_compat's fix. If a later kit
# fixes its prefix write, the unpatched case passes, the strict xfail turns
# into a failure, and kit_compat can go.
TRITON_CG = [("mla", 1, 1), ("gqa", 1, 1)]


def _triton_cg(k, arch, topk, page_size, name):
    n = 4 if topk == 1 else 3
    case = _case(k, arch, "triton", page_size, n, name)
    if arch == "mla":
        k["tv"].run_mla_eagle_verify_cuda_graph_case(_TC(), case, topk=topk, **MLA_KW)
    else:
        k["tv"].run_dense_spec_verify_cuda_graph_case(_TC(), case, topk=topk, **GQA_KW)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="SGLang 0.5.23 kit writes the graph fixture's prefix K/V at slots req_to_token does not hold")
@pytest.mark.parametrize("arch,topk,page_size", TRITON_CG)
def test_kit_cuda_graph_triton_unpatched_fails(arch, topk, page_size):
    _triton_cg(_kit(), arch, topk, page_size, f"va_cg_{arch}_k{topk}_p{page_size}")


@pytest.mark.parametrize("arch,topk,page_size", TRITON_CG)
def test_kit_cuda_graph_triton_patched_passes(arch, topk, page_size, monkeypatch):
    k = _kit()
    kit_compat.patch_target_verify_runner(monkeypatch, k["tv"])
    _triton_cg(k, arch, topk, page_size, f"va_cg_{arch}_k{topk}_p{page_size}")


# ----------------------------------------------------------------------------- vs Triton


def _tree_parents(topk, n, rng):
    if topk == 1:
        return [-1] + list(range(n - 1))
    from verify_attn import testing

    return testing.random_parents("eagle", n, rng=rng, topk=topk)


def _ancestor_matrix(parents, device):
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for t in range(n):
        c = t
        while c >= 0:
            m[t, c] = True
            c = parents[c]
    return m.to(device)


def _build(k, arch, case, kit_kw=None):
    if arch == "mla":
        fx = k["mla"].build_mla_attention_fixture(_TC(), case, **(kit_kw or MLA_KW))
        inputs = k["mla"].mla_fixture_inputs(fx)
        return fx, inputs, k["mla"].run_mla_forward, k["mla"].mla_attention_reference_with_custom_mask
    fx = k["dense"].build_dense_attention_fixture(_TC(), case, **(kit_kw or GQA_KW))
    inputs = k["dense"].dense_fixture_inputs(fx)
    return fx, inputs, k["dense"].run_dense_forward, k["dense"].dense_attention_reference_with_custom_mask


def _verify_input(k, case, batch, topk, n, custom_mask, device):
    bs = case.batch_size
    ri = torch.arange(n, dtype=torch.long, device=device).repeat(bs, 1)
    return k["EagleVerifyInput"](
        draft_token=batch.input_ids, custom_mask=custom_mask, positions=batch.positions,
        retrieve_index=ri, retrieve_next_token=torch.full_like(ri, -1),
        retrieve_next_sibling=torch.full_like(ri, -1),
        retrieve_cum_len=torch.arange(bs + 1, dtype=torch.int32, device=device) * n,
        spec_steps=max(0, n - 1), topk=topk, draft_token_num=n,
        capture_hidden_mode=k["CaptureHiddenMode"].FULL, seq_lens_sum=batch.seq_lens_sum,
        seq_lens_cpu=batch.seq_lens_cpu)


def _run(k, arch, backend_name, page_size, topk, n, trees, mask_layout, prefix_lens, with_fixture=False,
         layers=1, kit_kw=None):
    """Build the kit fixture for one backend and run one target verify (``layers``
    forwards of the kit's attention layer after one init_forward_metadata, as a
    model's layers run; each the same result).

    mask_layout: "full" (SGLang's FULL mask), "qlen" (QLEN_ONLY in the backend's
    own VerifyMask buffer, as EAGLE writes it) or "qlen_foreign" (QLEN_ONLY in a
    tensor of its own, as NGRAM builds it)."""
    device = "cuda"
    # one name for both backends: the kit seeds weights/inputs from the name
    case = _case(k, arch, backend_name, page_size, n, f"va_cmp_{arch}_k{topk}_p{page_size}_n{n}",
                 prefix_lens=prefix_lens)
    fx, inputs, run_forward, reference = _build(k, arch, case, kit_kw)
    batch = fx.forward_batch
    k["tv"]._prepare_target_verify_batch(batch, case, device)
    anc = [_ancestor_matrix(p, device) for p in trees]
    masks_by_req = []
    full = []
    for p, a in zip(case.prefix_lens, anc):
        m = torch.ones(n, p + n, dtype=torch.bool, device=device)
        m[:, p:] = a
        masks_by_req.append(m)
        full.append(m.reshape(-1))
    if mask_layout == "full":
        custom_mask = torch.cat(full)
    elif mask_layout == "qlen_foreign":
        custom_mask = torch.cat([a.reshape(-1) for a in anc])
    else:  # QLEN_ONLY, written into the backend's VerifyMask buffer like EAGLE's tree builder
        vm = fx.backend.verify_mask
        assert vm is not None and vm.mode.name == "QLEN_ONLY", vm
        qlen = torch.cat([a.reshape(-1) for a in anc])
        vm.buffer.fill_(True)
        vm.buffer[: qlen.numel()] = qlen
        custom_mask = vm.buffer
    batch.spec_info = _verify_input(k, case, batch, topk, n, custom_mask, device)
    expected = reference(fx.reference_module, case, inputs["prefix_hidden"], inputs["input_hidden"], masks_by_req)
    with torch.no_grad(), k["forward_context"](k["ForwardContext"](attn_backend=fx.backend)):
        fx.backend.init_forward_metadata(batch)
        actual = run_forward(fx, batch, inputs)
        for _ in range(layers - 1):
            again = run_forward(fx, batch, inputs)
            assert torch.equal(again, actual)
    torch.cuda.synchronize()
    if with_fixture:
        return actual.float(), expected.float(), fx, batch
    return actual.float(), expected.float(), fx.backend


# page_size 64: the backend passes the kv_slot_runs hint (asserted below); MLA then runs the
# rows-map TMA kernel on sm_90 (kernels/plan.cc; the plan of every call is pinned below), GQA
# the portable one.
VS_CONFIGS = list(itertools.product(("mla", "gqa"), (1, 4), PAGE_SIZES + (64,)))
ROWS_TMA = "mla_wgmma_seesaw_tma_rows"


@pytest.mark.parametrize("arch,topk,page_size", VS_CONFIGS)
def test_vs_triton(arch, topk, page_size, monkeypatch):
    import verify_attn

    k = _kit()
    n = 16
    rng = random.Random(1000 * topk + page_size)
    prefix_lens = (5, 37, 64, 100)  # page-aligned and not; MAX_CTX 128 >= prefix + 16
    trees = [_tree_parents(topk, n, rng) for _ in prefix_lens]
    tri, ref, tb = _run(k, arch, "triton", page_size, topk, n, trees, "full", prefix_lens)
    # Which configuration each of our runs launched: the plan's info for the very
    # tensors the backend passes (it launches nothing; the launch never falls back).
    planned = []
    run = verify_attn.TreeAttentionPlan.run

    def recording(self, q, k_cache, v_cache=None, **kw):
        planned.append(self.info(q, k_cache, v_cache, out=kw.get("out"), lse=kw.get("lse"))["name"])
        return run(self, q, k_cache, v_cache, **kw)

    monkeypatch.setattr(verify_attn.TreeAttentionPlan, "run", recording)
    # Three layers' forwards after one init_forward_metadata: one plan for all of them.
    ours, ref2, vb = _run(k, arch, "verify_attn", page_size, topk, n, trees, "qlen", prefix_lens, layers=3)
    ours_full, _, vb_full = _run(k, arch, "verify_attn", page_size, topk, n, trees, "full", prefix_lens)
    from verify_attn_sglang.backend import VerifyAttnBackend

    assert isinstance(vb, VerifyAttnBackend) and vb.va_enabled, getattr(vb, "va_reason", None)
    assert vb.va_plans_made == 1 and vb_full.va_plans_made == 1, (vb.va_plans_made, vb_full.va_plans_made)
    assert len(planned) == 4, planned
    assert vb._va_slot_runs == (64 if page_size == 64 else 1), vb._va_slot_runs
    rows_tma = arch == "mla" and page_size == 64 and torch.cuda.get_device_capability() == (9, 0)
    assert planned and all(name.endswith(ROWS_TMA) == rows_tma for name in planned), planned
    assert type(tb).__name__ == "TritonAttnBackend"
    assert torch.equal(ref, ref2)  # same weights and inputs in both fixtures
    e_ours_tri = (ours - tri).abs().max().item()
    e_ours_ref = (ours - ref).abs().max().item()
    e_tri_ref = (tri - ref).abs().max().item()
    e_layouts = (ours - ours_full).abs().max().item()
    print(f"VA_WORST {arch} topk={topk} page_size={page_size} n={n}: |ours-triton|={e_ours_tri:.3e} "
          f"|ours-ref|={e_ours_ref:.3e} |triton-ref|={e_tri_ref:.3e} |qlen-full|={e_layouts:.3e}")
    torch.testing.assert_close(ours, tri, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=RTOL)
    assert e_layouts == 0.0


# ----------------------------------------------------------------------------- fp8 (e4m3) pools
#
# The kit's dense fixture builds a bf16 pool and writes the prefix without scales; here its pool is
# float8_e4m3fn (the runner's kv_cache_dtype says so before the backend is built, as SGLang's
# --kv-cache-dtype fp8_e4m3 does), the layer carries k_scale / v_scale (tensor and host float, as a
# checkpoint's scales load), and the prefix is written as SGLang's prefill writes it (K / k_scale,
# V / v_scale). Both backends then store their drafts with the layer's scales and read the same pool.

FP8_SCALES = (0.5, 2.0)  # k_scale, v_scale: neither is 1, so a dropped or swapped scale shows
FP8_CONFIGS = [(128, 4, 1), (128, 1, 16), (64, 4, 16), (64, 1, 1)]


def _fp8_fixture(monkeypatch, k, k_scale, v_scale):
    dense = k["dense"]
    make_pool, runner_init, populate = dense.MHATokenToKVPool, dense.MockModelRunner.__init__, dense._populate_prefix_kv

    def fp8_pool(*a, **kw):
        return make_pool(*a, **dict(kw, dtype=torch.float8_e4m3fn))

    def fp8_runner(self, *a, **kw):
        runner_init(self, *a, **kw)
        self.kv_cache_dtype, self.kv_cache_dtype_str = torch.float8_e4m3fn, "fp8_e4m3"

    def scaled_prefix(module, case, runner, prefix_hidden, **kw):
        layer = module.attn
        layer.k_scale = torch.tensor(k_scale, dtype=torch.float32, device="cuda")
        layer.v_scale = torch.tensor(v_scale, dtype=torch.float32, device="cuda")
        layer.k_scale_float, layer.v_scale_float = k_scale, v_scale
        pool = runner.token_to_kv_pool
        write = pool.set_kv_buffer
        pool.set_kv_buffer = lambda lay, loc, kk, vv: write(lay, loc, kk.clone(), vv.clone(), lay.k_scale, lay.v_scale)
        try:
            populate(module, case, runner, prefix_hidden, **kw)
        finally:
            del pool.set_kv_buffer

    monkeypatch.setattr(dense, "MHATokenToKVPool", fp8_pool)
    monkeypatch.setattr(dense.MockModelRunner, "__init__", fp8_runner)
    monkeypatch.setattr(dense, "_populate_prefix_kv", scaled_prefix)


@pytest.mark.parametrize("head_dim,topk,page_size", FP8_CONFIGS)
def test_fp8_pool_vs_triton(head_dim, topk, page_size, monkeypatch):
    """GQA (8/2) on an e4m3 pool with k_scale 0.5, v_scale 2.0 (_fp8_vs_triton)."""
    k = _kit()
    _fp8_fixture(monkeypatch, k, *FP8_SCALES)
    _fp8_vs_triton(monkeypatch, k, "gqa", topk, page_size, dict(GQA_KW, head_dim=head_dim), FP8_SCALES)


# SGLang 0.5.23's Triton backend does not compile the kit's MLA target verify on an fp8 pool:
# extend_attention's draft product tl.dot(q, k_extend) meets a bf16 q and the fp8 k_extend the
# kit's MLA layer passes. The MLA test checks that it still fails (strict: a later SGLang that
# compiles it turns the comparison on) and checks ours against the dequantized pool alone.
TRITON_MLA_FP8_FAILS = r"Unsupported rhs dtype fp8e4nv"


@pytest.mark.parametrize("topk,page_size", [(4, 1), (1, 16), (4, 64)])
def test_fp8_mla_pool_vs_triton(topk, page_size, monkeypatch):
    """MLA (16 heads, 576 / 512) on the kit's own fp8 pool (``fp8_kv_cache``: the layer
    writes its latent rows cast to e4m3, no scale): ``_fp8_vs_triton``, Triton failing."""
    k = _kit()
    _fp8_vs_triton(monkeypatch, k, "mla", topk, page_size, dict(MLA_KW, fp8_kv_cache=True), (1.0, 1.0),
                   triton_fails=TRITON_MLA_FP8_FAILS)


def _fp8_vs_triton(monkeypatch, k, arch, topk, page_size, kit_kw, scales, triton_fails=None):
    """The attention output (before the layer's output projection) of our backend on an
    e4m3 pool against an fp32 computation over the dequantized pool (relative error
    under 1e-2), against Triton's on the same pool (which casts q to fp8 for the prefix:
    a looser bound), and the layer outputs of both against the kit's fp32 reference on
    the unquantized K / V (the quantization error, printed; ours within Triton's + 1e-2).
    triton_fails: Triton's run is expected to raise this (regex), and ours is checked
    against the dequantized pool alone (the kit's reference error printed)."""
    import verify_attn
    from sglang.srt.layers.radix_attention import RadixAttention
    from verify_attn_sglang.backend import VerifyAttnBackend

    ks, vs = scales
    seen = []
    attend = RadixAttention.forward

    def recording(self, q, kk, vv, forward_batch, *a, **kw):
        o = attend(self, q, kk, vv, forward_batch, *a, **kw)
        seen.append((q.detach().clone(), o.detach().clone()))
        return o

    monkeypatch.setattr(RadixAttention, "forward", recording)
    planned = []
    run = verify_attn.TreeAttentionPlan.run

    def recording_run(self, q, k_cache, v_cache=None, **kw):
        planned.append((self.info(q, k_cache, v_cache, out=kw.get("out"))["name"], k_cache.dtype,
                        kw.get("k_scale"), kw.get("v_scale")))
        return run(self, q, k_cache, v_cache, **kw)

    monkeypatch.setattr(verify_attn.TreeAttentionPlan, "run", recording_run)
    n = 16
    rng = random.Random(f"fp8 {arch} {kit_kw.get('head_dim')} {topk} {page_size}")
    prefix_lens = (5, 37, 64, 100)
    trees = [_tree_parents(topk, n, rng) for _ in prefix_lens]
    errs = {}
    outs = {}
    for name in ("verify_attn", "triton"):
        seen.clear()
        mask = "full" if name == "triton" else "qlen"
        if name == "triton" and triton_fails is not None:
            with pytest.raises(Exception, match=triton_fails):
                _run(k, arch, name, page_size, topk, n, trees, mask, prefix_lens, with_fixture=True, kit_kw=kit_kw)
            break
        layer_out, kit_ref, fx, batch = _run(k, arch, name, page_size, topk, n, trees, mask, prefix_lens,
                                             with_fixture=True, kit_kw=kit_kw)
        assert len(seen) == 1, len(seen)
        q, o = seen[0]
        layer = fx.actual_module.attn_mqa if arch == "mla" else fx.actual_module.attn
        pool = fx.runner.token_to_kv_pool
        kc = pool.get_key_buffer(layer.layer_id)
        vc = kc[..., : layer.v_head_dim] if arch == "mla" else pool.get_value_buffer(layer.layer_id)
        assert kc.dtype == torch.float8_e4m3fn and vc.dtype == torch.float8_e4m3fn
        H, dqk, dvo = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        want = _tree_reference(q.reshape(-1, H, dqk), kc.float() * ks, vc.float() * vs,
                               fx.runner.req_to_token_pool.req_to_token, batch.req_pool_indices, prefix_lens,
                               batch.out_cache_loc, trees, layer.scaling)
        got = o.float().reshape(-1, H, dvo)
        assert not torch.isnan(got).any()
        errs[name] = (((got - want).abs().max() / want.abs().max()).item(),
                      (layer_out - kit_ref).abs().max().item())
        outs[name] = got
        if name == "verify_attn":
            b = fx.backend
            assert isinstance(b, VerifyAttnBackend) and b.va_enabled and b._va_kv_fp8, b.va_reason
    want_scales = (ks, None) if arch == "mla" else (ks, vs)
    assert planned and all(p[1] == torch.float8_e4m3fn and p[2:] == want_scales for p in planned), planned
    label = (f"VA_WORST fp8 {arch} d{kit_kw.get('head_dim', 576)} topk={topk} page_size={page_size} n={n} "
             f"plan={planned[0][0]}: ours vs dequantized-pool fp32 {errs['verify_attn'][0]:.3e}")
    assert errs["verify_attn"][0] < 1e-2, errs
    if triton_fails is not None:
        # Against the unquantized reference: the latent's e4m3 rounding (unscaled, as the kit
        # writes it) is the error there, reported as issue 42 asks, not bounded.
        print(f"{label}; layer output vs the unquantized fp32 reference {errs['verify_attn'][1]:.3e}; "
              f"triton does not compile it ({triton_fails})")
        return
    e_pair = ((outs["verify_attn"] - outs["triton"]).abs().max() / outs["triton"].abs().max()).item()
    print(f"{label}, triton {errs['triton'][0]:.3e}, |ours-triton|/max {e_pair:.3e}; layer output vs the "
          f"unquantized fp32 reference: ours {errs['verify_attn'][1]:.3e}, triton {errs['triton'][1]:.3e}")
    assert e_pair < 5e-2, e_pair
    assert errs["verify_attn"][1] <= errs["triton"][1] + 1e-2, errs


def test_compact_mask_buffer_only():
    """While our backend serves verify, SGLang's verify mask is QLEN_ONLY (bs*N*N bools),
    eager and after init_cuda_graph_state; Triton's would be FULL."""
    k = _kit()
    n = 16
    case = _case(k, "mla", "verify_attn", 1, n, "va_mem", prefix_lens=(5, 37))
    fx = k["mla"].build_mla_attention_fixture(_TC(), case, **MLA_KW)
    b = fx.backend
    vm = b.verify_mask
    assert vm.mode.name == "QLEN_ONLY" and vm.buffer.numel() == vm.max_bs * n * n
    b.init_cuda_graph_state(max_bs=2, max_num_tokens=2 * n)
    vm = b.verify_mask
    assert vm.mode.name == "QLEN_ONLY" and vm.buffer.numel() == vm.max_bs * n * n
    case_t = _case(k, "mla", "triton", 1, n, "va_mem", prefix_lens=(5, 37))
    ft = k["mla"].build_mla_attention_fixture(_TC(), case_t, **MLA_KW)
    ft.backend.init_cuda_graph_state(max_bs=2, max_num_tokens=2 * n)
    assert ft.backend.verify_mask.mode.name == "FULL_MASK"
    print(f"VA_MASK_BYTES ours={vm.buffer.numel()} triton={ft.backend.verify_mask.buffer.numel()} "
          f"(max_bs 2, N {n}, context {MAX_CTX})")


# ----------------------------------------------------------------------------- padded CUDA-graph replay
#
# SGLang pads a replay batch to the next captured size and hands the backend
# decode_cuda_graph_runner.build_replay_fb_view: padded capture buffers for
# req_pool_indices / seq_lens / seq_lens_cpu (padded lanes: fill value 1, pool row
# 0), num_padding = bs - raw_bs, but the real batch's out_cache_loc and spec_info
# (NGRAM's own QLEN_ONLY mask holds raw_bs * n * n bools). The kit's graph runner
# pads differently (its replay batch is a full bs batch), so this builds the view
# as SGLang does, captures forward_extend in a torch CUDA graph at bs 4 and replays
# it for 3 real requests. Checked against an fp32 computation over the cache
# written by the eager leg (prefix rows via req_to_token, drafts at out_cache_loc).

PAD_CONFIGS = [("mla", "qlen_foreign"), ("mla", "qlen"), ("mla", "full"), ("mla", "chain"),
               ("gqa", "qlen_foreign"), ("gqa", "full")]


def _tree_reference(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, out_cache_loc, trees, scale):
    """fp32 attention of each real request's drafts over its prefix (req_to_token
    rows) and its draft ancestors (out_cache_loc slots). q [T, H, Dqk]."""
    outs = []
    n = len(trees[0])
    for r, (p, parents) in enumerate(zip(prefix_lens, trees)):
        slots = torch.cat([req_to_token[int(req_pool_indices[r]), :p].long(),
                           out_cache_loc[r * n:(r + 1) * n].long()])
        K, V = k_cache[slots].float(), v_cache[slots].float()  # [L, Hk, D]
        g = q.shape[1] // K.shape[1]
        K, V = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)
        anc = _ancestor_matrix(parents, "cpu")
        for t in range(n):
            vis = torch.cat([torch.ones(p, dtype=torch.bool), anc[t]]).to(q.device)
            sc = torch.einsum("hd,khd->hk", q[r * n + t].float(), K[vis]) * scale
            outs.append(torch.einsum("hk,khd->hd", sc.softmax(-1), V[vis]))
    return torch.stack(outs)


@pytest.mark.parametrize("arch,layout", PAD_CONFIGS)
def test_padded_cuda_graph_replay(arch, layout):
    from types import SimpleNamespace

    k = _kit()
    n, raw_bs, bs = 8, 3, 4
    topk = 1 if layout == "chain" else 4
    seed = random.randrange(1 << 30)  # fresh trees and queries every run; printed with the result
    rng = random.Random(seed)
    prefix_lens = (5, 37, 64)
    trees = [_tree_parents(topk, n, rng) for _ in prefix_lens]
    # eager leg: fixture built, prefix + draft K/V written to the cache, checked vs the kit's reference
    mask_layout = "qlen" if layout == "chain" else layout
    actual, expected, fx, batch = _run(k, arch, "verify_attn", 1, topk, n, trees, mask_layout, prefix_lens,
                                       with_fixture=True)
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)
    b = fx.backend
    layer = fx.actual_module.attn_mqa if arch == "mla" else fx.actual_module.attn
    dev = batch.seq_lens.device
    b.init_cuda_graph_state(max_bs=bs, max_num_tokens=bs * n)
    spec = batch.spec_info
    if layout in ("qlen", "chain"):  # EAGLE writes into the (possibly new) own buffer
        vm = b.verify_mask.buffer
        vm.fill_(True)
        qlen = torch.cat([_ancestor_matrix(p, dev).reshape(-1) for p in trees])
        vm[: qlen.numel()] = qlen
        spec.custom_mask = vm
    TV = k["ForwardMode"].TARGET_VERIFY
    fill = b.get_cuda_graph_seq_len_fill_value()

    def view(seq_lens, rpi, ocl, spec_info, num_padding):
        return SimpleNamespace(
            batch_size=bs, forward_mode=TV, actual_forward_mode=TV, req_pool_indices=rpi, seq_lens=seq_lens,
            seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.cpu(), out_cache_loc=ocl,
            kv_loc_plan=batch.kv_loc_plan, kv_loc_cols=getattr(batch, "kv_loc_cols", None),
            num_padding=num_padding, spec_info=spec_info)

    zeros_i = torch.zeros(bs, dtype=batch.req_pool_indices.dtype, device=dev)
    cap_spec = SimpleNamespace(custom_mask=b.verify_mask.buffer, topk=topk, num_tokens_per_req=n)
    cap = view(torch.full((bs,), fill, dtype=batch.seq_lens.dtype, device=dev), zeros_i,
               torch.zeros(bs * n, dtype=batch.out_cache_loc.dtype, device=dev), cap_spec, 0)
    H, dqk = layer.tp_q_head_num, layer.qk_head_dim
    torch.manual_seed(seed)
    q_buf = torch.randn(bs * n, H, dqk, dtype=DTYPE, device=dev)
    with torch.no_grad():
        b.init_forward_metadata_out_graph(cap, in_capture=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            b.forward_extend(q_buf, None, None, layer, cap, save_kv_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o_buf = b.forward_extend(q_buf, None, None, layer, cap, save_kv_cache=False)
        # the padded replay, as build_replay_fb_view hands it
        rpi = torch.cat([batch.req_pool_indices, zeros_i[: bs - raw_bs]])
        sl = torch.cat([batch.seq_lens, torch.full((bs - raw_bs,), fill, dtype=batch.seq_lens.dtype, device=dev)])
        assert batch.out_cache_loc.numel() == raw_bs * n
        o_buf.fill_(float("nan"))
        b.init_forward_metadata_out_graph(view(sl, rpi, batch.out_cache_loc, spec, bs - raw_bs))
        graph.replay()
    torch.cuda.synchronize()
    pool = fx.runner.token_to_kv_pool
    kc = pool.get_key_buffer(layer.layer_id)
    if arch == "mla":
        vc = kc[..., : layer.v_head_dim]
    else:
        vc = pool.get_value_buffer(layer.layer_id)
    want = _tree_reference(q_buf[: raw_bs * n], kc, vc, fx.runner.req_to_token_pool.req_to_token,
                           batch.req_pool_indices, prefix_lens, batch.out_cache_loc, trees, layer.scaling)
    got = o_buf[: raw_bs * n].float().view(raw_bs * n, H, -1)
    err = ((got - want).abs().max() / want.abs().max()).item()
    print(f"VA_WORST padded_replay {arch} {layout} raw_bs={raw_bs} bs={bs} n={n} seed={seed}: "
          f"rel max err {err:.3e}")
    assert not torch.isnan(got).any()
    assert err < 1e-2, err
