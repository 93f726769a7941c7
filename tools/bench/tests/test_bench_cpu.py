"""CPU tests of the benchmark's library (tools/bench/benchlib) and of `tools/bench/bench.py --dry_run`.

Covers the parts that need no GPU: the shape grid, the floor arithmetic,
SGLang's FULL-mask construction (against verify_attn.masks), the random
scattered paged inputs (against the reference's gather), the runner's
summary (speedups, floor fractions) and the report (table, JSON, PNG) with
fake timings, CPU timing, the FlexAttention adapter's mask_mod (eager, against
the float64 reference), the fixture adapter, and the whole pipeline with
``--dry_run``. Opt-in (VERIFY_ATTN_TEST_SGLANG_INTERPRET=1 and a staged
.gpu_stage/baselines and Triton installed): SGLang's staged Triton kernels under
the Triton interpreter against the reference.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _bench_dir():
    """tools/bench/ (benchlib's folder): this test folder's parent, in the
    repository and in Bazel's runfiles."""
    for base in (_HERE, os.path.dirname(os.path.realpath(__file__))):
        cand = os.path.dirname(base)
        if os.path.isdir(os.path.join(cand, "benchlib")):
            return cand
    return None


try:
    import benchlib  # noqa: F401
except ImportError:
    _b = _bench_dir()
    if _b:
        sys.path.insert(0, _b)

from benchlib import check, floor, inputs, report, runner, shapes, timing, workload  # noqa: E402
from benchlib.baselines import NotApplicable, short_reason  # noqa: E402
from verify_attn import masks  # noqa: E402
from verify_attn.reference import gather_paged_kv  # noqa: E402

K = 1024


# ---------------------------------------------------------------------------
# shapes


def _key(s):
    return (s.model, s.batch, s.heads, s.q_len, s.prefix)


def test_quick_grid_has_every_design_row():
    q = shapes.grid("quick")
    keys = {(s.model, s.batch, s.heads, s.q_len, s.prefix, s.tree == "chain") for s in q}
    for b, h, t, l in shapes.DESIGN_ROWS + shapes.FLASHMLA_ROWS:
        assert ("mla", b, h, t, l, False) in keys, (b, h, t, l)
    for s in q:
        if s.mla:
            assert (s.kv_heads, s.d_qk, s.d_vo) == (1, 576, 512)
    chains = [s for s in q if s.is_chain and s.mla]
    assert {(s.batch, s.heads, s.q_len, s.prefix) for s in chains} >= {
        (1, 16, 16, 4 * K), (1, 128, 32, 8 * K), (32, 16, 16, 4 * K)} | set(shapes.FLASHMLA_ROWS)


def test_quick_grid_gqa_and_ddtree():
    q = shapes.grid("quick")
    g = [s for s in q if s.model == "gqa"]
    assert g and all(s.d_qk == 128 and s.heads // s.kv_heads == 8 for s in g)
    assert {s.q_len for s in g} >= {4, 16, 64}
    assert min(s.prefix for s in g) == 1 * K and max(s.prefix for s in g) == 64 * K
    assert min(s.batch for s in g) == 1 and max(s.batch for s in g) == 64
    assert max(s.q_len for s in q) == 1024  # DDTree budget
    flex = [s for s in q if shapes.wants_flex(s, "auto", "quick")]
    assert 1 <= len(flex) <= 4  # keep torch.compile time low
    names = {s.name for s in flex}
    assert "gqa B16 H32/4 D128 T16 L8k ddtree" in names
    assert any(s.mla for s in flex)
    assert len({s.name for s in q}) == len(q)


def test_full_grid_superset_and_cube():
    q = {s.name for s in shapes.grid("quick")}
    f = shapes.grid("full")
    names = [s.name for s in f]
    assert len(set(names)) == len(names)
    assert q <= set(names)
    cube = {(s.batch, s.q_len, s.prefix) for s in f if s.model == "gqa"}
    for t in (4, 16, 64):
        for l in (1 * K, 8 * K, 64 * K):
            for b in (1, 16, 64):
                assert (b, t, l) in cube
    assert {16, 64, 256, 1024} <= {s.q_len for s in f if "ddtree" in s.tags}


def test_filter_and_flex_policy():
    q = shapes.grid("quick")
    sel = shapes.filter_shapes(q, "MLA B1 H16 T16, gqa B64")
    assert sel and all(("mla b1 h16 t16" in s.name.lower()) or ("gqa b64" in s.name.lower()) for s in sel)
    assert shapes.filter_shapes(q, None) == q
    assert shapes.filter_shapes(q, " , ") == q
    s = q[0]
    assert shapes.wants_flex(s, "all", "quick") and not shapes.wants_flex(s, "none", "quick")
    with pytest.raises(ValueError):
        shapes.wants_flex(s, "bogus", "quick")
    with pytest.raises(ValueError):
        shapes.grid("nope")
    assert shapes.fmt_len(4096) == "4k" and shapes.fmt_len(1000) == "1000"


# ---------------------------------------------------------------------------
# floor


def test_floor_design_example():
    # DESIGN.md §3: batch 1, 16 heads, 64 drafts, 32k prefix = 73 GFLOP, ~107 us at 686 TFLOP/s
    s = shapes.mla(1, 16, 64, 32 * K)
    f = floor.flops(s)
    assert f == 2 * 16 * 64 * (32 * K + 64) * (576 + 512)
    assert abs(f / 1e9 - 73.1) < 0.5
    assert floor.kv_bytes(s) == (32 * K + 64) * 576 * 2
    ceil = floor.nominal_ceilings()
    assert abs(floor.floor_seconds(s, ceil) * 1e6 - 106.6) < 1.0
    assert floor.bound(s, ceil) == "compute"
    m = floor.metrics(s, 4038e-6, ceil)  # SGLang's Triton tree path, DESIGN.md §2
    assert abs(m["tflops"] - 18.1) < 0.3
    assert abs(m["frac_floor"] - 106.6 / 4038) < 1e-3
    assert floor.metrics(s, None, ceil) == {}
    assert abs(floor.arithmetic_intensity(s) - 1.9 * 16 * 64) / (1.9 * 16 * 64) < 0.05


def test_floor_gqa_and_ragged():
    s = shapes.gqa(4, 16, 8 * K)   # H32/4 D128
    assert floor.kv_bytes(s) == 4 * (8 * K + 16) * 4 * 128 * 2 * 2
    assert floor.flops(s) == 4 * 2 * 32 * 16 * (8 * K + 16) * 256
    ceil = floor.nominal_ceilings()
    small = shapes.gqa(1, 4, 1 * K)  # rows per KV head 8*4 = 32 < 80: bandwidth-bound
    assert floor.bound(small, ceil) == "bandwidth"
    r = shapes.Shape("gqa", 2, 8, 2, 64, 64, 5, 100, "random", q_lens=(3, 5), prefix_lens=(100, 7))
    assert floor.kv_bytes(r) == (103 + 12) * 2 * 128 * 2
    assert floor.flops(r) == 2 * 8 * (3 * 103 + 5 * 12) * 128


# ---------------------------------------------------------------------------
# inputs and SGLang's FULL mask


@pytest.mark.parametrize("kind", ["ddtree", "chain", "random", "shuffled"])
def test_full_mask_matches_masks_module(kind):
    shp = shapes.Shape("gqa", 3, 4, 2, 64, 64, 7, 11, kind, q_lens=(7, 1, 40), prefix_lens=(11, 0, 33))
    case = inputs.build_case(shp, "cpu", seed=1)
    full, mind = case.full_mask()
    sizes = [t * (l + t) for t, l in zip(case.q_lens, case.prefix_lens)]
    assert full.dtype == torch.bool and full.numel() == sum(sizes)
    assert mind.dtype == torch.int64 and mind.tolist() == [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    back = masks.from_sglang_full_mask(full, case.qo_indptr, case.prefix_lens_t, mask_indptr=mind)
    want = masks.to_dense(case.tree_mask, case.qo_indptr)
    got = masks.to_dense(back, case.qo_indptr)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    # prefix columns all True; draft columns = the ancestor matrix, row-major
    off = 0
    for i, (t, l) in enumerate(zip(case.q_lens, case.prefix_lens)):
        block = full[off: off + t * (l + t)].reshape(t, l + t)
        assert bool(block[:, :l].all())
        assert torch.equal(block[:, l:], want[i])
        off += t * (l + t)


@pytest.mark.parametrize("page_size,slot_runs", [(1, 1), (4, 1), (1, 8)])
def test_inputs_layouts_agree(page_size, slot_runs):
    for shp in (shapes.Shape("mla", 3, 2, 1, 576, 512, 5, 9, "ddtree"),
                shapes.Shape("gqa", 2, 4, 2, 64, 64, 6, 13, "eagle", q_lens=(6, 2), prefix_lens=(13, 30))):
        case = inputs.build_case(shp, "cpu", page_size=page_size, seed=2, slot_runs=slot_runs)
        s = inputs.make_inputs(case)
        assert case.total_kv == sum(case.kv_lens)
        if slot_runs > 1:  # row j of a request at slot run[j // 8] * 8 + j % 8, runs scattered
            kvp = case.kv_indptr_flat.tolist()
            for i in range(case.batch):
                sl = case.token_slots[kvp[i]:kvp[i + 1]]
                j = torch.arange(len(sl))
                assert torch.equal(sl % slot_runs, j % slot_runs)
                assert torch.equal(sl - j % slot_runs, (sl[::slot_runs] - 0).repeat_interleave(slot_runs)[:len(sl)])
            assert torch.equal(case.kv_indices.long(), case.token_slots)
        # pages are distinct, scattered and in range
        ids = case.kv_indices.tolist()
        assert len(set(ids)) == len(ids) and max(ids) < case.num_pages
        # the flat layout equals the paged cache gathered by the reference's own gather
        kf, ind = gather_paged_kv(s.k_cache, case.kv_indptr_pages, case.kv_indices, case.kv_len,
                                  page_size=page_size)
        assert torch.equal(kf, s.k_flat)
        assert ind.tolist() == case.kv_indptr_flat.tolist()
        if shp.mla:
            assert s.v_cache is None and s.v_flat is None
            assert torch.equal(s.v_ext, s.k_ext[..., :512])
            assert s.v_slots.data_ptr() == s.k_slots.data_ptr()
        else:
            vf, _ = gather_paged_kv(s.v_cache, case.kv_indptr_pages, case.kv_indices, case.kv_len,
                                    page_size=page_size)
            assert torch.equal(vf, s.v_flat)
        # SGLang's view: prefix slots + contiguous drafts
        kvp = case.kv_indptr_flat.tolist()
        pp = case.prefix_indptr.tolist()
        qo = case.qo_indptr.tolist()
        for i in range(case.batch):
            l = case.prefix_lens[i]
            assert torch.equal(s.k_slots[case.prefix_slots[pp[i]:pp[i + 1]]], s.k_flat[kvp[i]:kvp[i] + l])
            assert torch.equal(s.k_ext[qo[i]:qo[i + 1]], s.k_flat[kvp[i] + l:kvp[i + 1]])
        assert s.q.abs().sum() > 0 and s.k_cache.abs().sum() > 0  # never zeros
        s2 = inputs.make_inputs(case, 1)
        assert not torch.equal(s.q, s2.q)


def test_given_parents_are_used():
    par = ((-1, 0, 0, 1), (-1, 0))
    shp = shapes.Shape("gqa", 2, 2, 1, 64, 64, 4, 3, "real", q_lens=(4, 2), prefix_lens=(3, 5), parents=par)
    case = inputs.build_case(shp, "cpu")
    want = masks.from_parents(torch.tensor([-1, 0, 0, 1, -1, 0]), case.qo_indptr)
    assert torch.equal(case.tree_mask, want)


def test_reference_subsample_choice():
    big = shapes.mla(4, 16, 64, 128 * K)
    case = type("C", (), {})()
    case.shape = big
    case.batch = 4
    case.q_lens = [64] * 4
    case.kv_lens = [128 * K + 64] * 4
    assert check.choose_requests(case) == [0, 3]
    small = shapes.mla(2, 4, 5, 37)
    c2 = inputs.build_case(small, "cpu")
    assert check.choose_requests(c2) == [0, 1]


# ---------------------------------------------------------------------------
# timing


def test_rotation_sets():
    assert timing.rotation_sets(1) == timing.MAX_SETS
    assert timing.rotation_sets(10 * timing.L2_BYTES) == 1
    assert timing.rotation_sets(timing.L2_BYTES) == 2
    assert timing.rotation_sets(0) == timing.MAX_SETS


def test_time_eager_cpu():
    calls = []
    fns = [lambda i=i: calls.append(i) for i in range(3)]
    t = timing.time_eager(fns, "cpu", warmup=1, target_ms=1, min_iters=4, max_iters=9)
    assert t.mode == "eager" and t.sets == 3 and 4 <= t.iters <= 9
    assert t.p10_us <= t.median_us <= t.p90_us
    assert set(calls) == {0, 1, 2}
    with pytest.raises(RuntimeError):
        timing.time_graph(fns, "cpu")


def test_retime_rounds_alternates_order_and_takes_medians():
    order, prepared = [], []

    class Fake:
        def __init__(self, name):
            self.name = name
            self.released = 0

        def prepare(self, case, inputs):
            prepared.append(self.name)
            return lambda: order.append(self.name)

        def release(self):
            self.released += 1

    impls = [Fake("a"), Fake("b"), Fake("c")]
    row = {"impls": {
        "a": {"status": "ok", "eager": {"median_us": 100.0}, "graph": None},
        "b": {"status": "wrong", "eager": {"median_us": 5.0}, "graph": None},
        "c": {"status": "failed", "reason": "x"},
    }}
    opts = runner.Options(device="cpu", rounds=3, warmup=1, target_ms=1, min_iters=1, max_iters=2)
    runner.retime_rounds(row, impls, None, [None], opts, "cpu")
    for name in ("a", "b"):
        rounds = row["impls"][name]["eager"]["rounds_us"]
        assert len(rounds) == 3 and rounds[0] == (100.0 if name == "a" else 5.0)
        assert row["impls"][name]["eager"]["median_us"] == pytest.approx(sorted(rounds)[1])
        assert "rounds_error" not in row["impls"][name]
    assert "eager" not in row["impls"]["c"] and impls[2].released == 0
    assert impls[0].released == 2 and impls[1].released == 2
    # round 2 prepares (and times) b before a, round 3 a before b; c, which failed, never
    assert prepared == ["b", "a", "a", "b"] and set(order) == {"a", "b"}


# ---------------------------------------------------------------------------
# runner summary and report, with fake timings


def _timing(us, mode):
    return {"mode": mode, "median_us": us, "p10_us": us, "p90_us": us, "iters": 10, "sets": 1}


def _fake_row(shape, ours_g, ours_e, ext_g, ext_e, chain=None, flex_status="failed"):
    row = runner._shape_info(shape, 1)
    ceil = floor.nominal_ceilings()
    row.update(kv_bytes=floor.kv_bytes(shape), flops=floor.flops(shape), bound=floor.bound(shape, ceil),
               floor_us=floor.floor_seconds(shape, ceil) * 1e6, check="ref", error=None)
    imp = {
        "ours_paged": {"label": "verify_attn paged", "status": "ok", "eager": _timing(ours_e, "eager"),
                       "graph": _timing(ours_g, "graph"), "err_ref": 3e-3, "competitor": False},
        "ours_flat": {"label": "verify_attn flat", "status": "ok", "eager": _timing(ours_e * 1.1, "eager"),
                      "graph": _timing(ours_g * 1.1, "graph"), "err_ref": 3e-3, "competitor": False},
        "sglang_extend": {"label": "SGLang extend (FULL mask)", "status": "ok",
                          "eager": _timing(ext_e, "eager"),
                          "graph": _timing(ext_g, "graph") if ext_g else None,
                          "graph_error": None if ext_g else "RuntimeError: capture failed",
                          "err_ref": 4e-3, "err_vs_ours": 2e-3, "competitor": True},
        "flex": {"label": "FlexAttention (torch.compile)", "status": flex_status,
                 "reason": "RuntimeError: compile failed: out of resource: shared memory", "competitor": True},
        "flashinfer": {"label": "FlashInfer", "status": "unavailable", "reason": "not stageable"},
    }
    if chain is not None:
        imp["sglang_chain"] = {"label": "SGLang verify_shared_kv (chain)", "status": "ok",
                               "eager": _timing(chain, "eager"), "graph": _timing(chain * 0.9, "graph"),
                               "err_ref": 3e-3, "competitor": True}
    else:
        imp["sglang_chain"] = {"label": "SGLang verify_shared_kv (chain)", "status": "n/a",
                               "reason": "chain-only kernel", "competitor": True}
    row["impls"] = imp
    runner.summarize(row, shape, ceil)
    return row


def test_summarize_speedups_and_fallback():
    s = shapes.mla(1, 16, 64, 32 * K)
    row = _fake_row(s, ours_g=200.0, ours_e=230.0, ext_g=4000.0, ext_e=4100.0, chain=300.0)
    assert row["basis"] == {"impl": "ours_paged", "mode": "graph", "us": 200.0}
    assert row["speedup"]["sglang_extend"]["x"] == pytest.approx(20.0)
    assert row["speedup"]["sglang_chain"]["x"] == pytest.approx(270.0 / 200.0)
    assert "flex" not in row["speedup"] and "flashinfer" not in row["speedup"]
    assert row["ours"]["frac_floor"] == pytest.approx(row["floor_us"] / 200.0)
    # a baseline that could not be captured is compared eager vs eager
    row2 = _fake_row(s, ours_g=200.0, ours_e=250.0, ext_g=None, ext_e=5000.0)
    assert row2["speedup"]["sglang_extend"] == {"x": pytest.approx(20.0), "mode": "eager",
                                                "baseline_wrong": False}


def test_report_render_json_plot(tmp_path):
    rows = [
        _fake_row(shapes.mla(1, 16, 16, 4 * K), 40.0, 60.0, 520.0, 600.0),
        _fake_row(shapes.mla(1, 16, 16, 4 * K, "chain"), 40.0, 60.0, 520.0, 600.0, chain=100.0),
        _fake_row(shapes.gqa(16, 16, 8 * K), 90.0, 110.0, None, 900.0, flex_status="ok"),
    ]
    rows[2]["impls"]["flex"].update(eager=_timing(8400.0, "eager"), graph=_timing(8300.0, "graph"),
                                    err_ref=5e-3)
    runner.summarize(rows[2], shapes.gqa(16, 16, 8 * K), floor.nominal_ceilings())
    err_row = runner._shape_info(shapes.mla(4, 16, 64, 128 * K), 1)
    err_row.update(impls={}, error="setup: MemoryError: too big")
    rows.append(err_row)
    text = report.render(rows, {"card": "NVIDIA H200 (fake)"})
    assert "mla B1 H16 T16 L4k ddtree" in text and "gqa B16 H32/4 D128 T16 L8k ddtree" in text
    assert "FAIL" in text and "n/a" in text and "ERROR" in text
    assert "13.0x" in text             # 520 / 40
    assert "92.2x" in text             # flex 8300 / 90
    assert "compile failed" in text and "not stageable" in text and "too big" in text
    assert "40.0g/60.0e" in text
    p = tmp_path / "out" / "b.json"
    report.write_json(str(p), {"rows": rows, "nan": float("nan")})
    data = json.loads(p.read_text())
    assert len(data["rows"]) == 4 and data["nan"] == "nan"
    png = report.plot(rows, str(tmp_path / "b.png"), title="fake")
    assert png and os.path.getsize(png) > 1000
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_compare_configs_column_and_forced_env(monkeypatch):
    """--compare_configs: a variant column '@tag' beside ours, and the forced
    configuration set only around the variant's own calls."""
    from benchlib import ours

    row = _fake_row(shapes.mla(1, 16, 64, 32 * K), 200.0, 230.0, 4000.0, 4100.0)
    row["impls"]["ours_paged@mla_wgmma_seesaw_tma_mc"] = {
        "label": "verify_attn paged @mla_wgmma_seesaw_tma_mc", "status": "ok", "competitor": False,
        "eager": _timing(210.0, "eager"), "graph": _timing(180.0, "graph"), "err_ref": 2e-3,
        "plan": "wgmma_bf16_mla_wgmma_seesaw_tma_mc"}
    headers, body = report.time_table([row])
    assert headers[2:5] == ["ours paged", "@mla_wgmma_seesaw_tma_mc", "ours flat"], headers
    assert body[0][3] == "180g/210e", body[0]
    # A tag the plan refused (unknown, or not for this layout): the cell says what ran instead.
    row["impls"]["ours_paged@mla_typo"] = dict(row["impls"]["ours_paged@mla_wgmma_seesaw_tma_mc"],
                                                plan="wgmma_bf16_mla_wgmma_seesaw_tma")
    headers, body = report.time_table([row])
    i = headers.index("@mla_typo")
    assert body[0][i] == "180g/210e (ran wgmma_bf16_mla_wgmma_seesaw_tma)", body[0]
    assert body[0][headers.index("@mla_wgmma_seesaw_tma_mc")] == "180g/210e", body[0]

    v = ours.OursPaged(force_config="mla_m32n32_s1")
    assert v.name == "ours_paged@mla_m32n32_s1" and v.check_vs_ours and not ours.OursPaged().check_vs_ours
    import verify_attn

    assert v.tuning() == verify_attn.Tuning(config="mla_m32n32_s1") and ours.OursPaged().tuning() is None
    with pytest.raises(ValueError, match="^tuning.config: unknown configuration tag 'mla_x'"):
        ours.OursPaged(force_config="mla_x").tuning()


def test_fp8_column_quantizes_the_caches_and_has_its_own_bound():
    """--kv_dtype=fp8_e4m3: the column ours_paged@fp8 runs GQA D64 / D128 rows only, on e4m3
    copies of the caches with per-tensor scales amax / 448 passed to the plan, and is judged
    against the q-dtype cache's result with its own tolerance (quantization included)."""
    import types

    from benchlib import ours

    v = ours.OursPagedFp8()
    assert v.name == "ours_paged@fp8" and not v.check_vs_ours and v.tol > check.TOL
    case = lambda shape: types.SimpleNamespace(shape=shape)  # noqa: E731
    assert v.applies(case(shapes.gqa(1, 16, 8 * K))) is None
    assert v.applies(case(shapes.gqa(1, 16, 8 * K, head_dim=64))) is None
    assert v.applies(case(shapes.mla(1, 16, 64, 32 * K))) is None
    assert v.applies(case(shapes.gqa(1, 16, 8 * K, head_dim=256))) is None  # every head dim on fp8
    g = torch.Generator().manual_seed(0)
    k, vv = torch.randn(50, 1, 4, 128, generator=g), 3 * torch.randn(50, 1, 4, 128, generator=g)
    inp = types.SimpleNamespace(k_cache=k.to(torch.bfloat16), v_cache=vv.to(torch.bfloat16))
    k8, v8, kw = v._caches(inp)
    assert k8.dtype == v8.dtype == torch.float8_e4m3fn == kw["kv_dtype"]
    assert kw["k_scale"] == pytest.approx(float(inp.k_cache.abs().max()) / 448)
    assert kw["v_scale"] == pytest.approx(float(inp.v_cache.abs().max()) / 448)
    for q8, scale, ref in ((k8, kw["k_scale"], k), (v8, kw["v_scale"], vv)):
        deq = q8.double() * scale
        assert float(deq.abs().max()) == pytest.approx(float(ref.abs().max()), rel=1e-2)
        assert float((deq - ref.double()).norm() / ref.double().norm()) < 0.05
    assert v._caches(inp)[0] is k8  # one copy per row's inputs
    mla_inp = types.SimpleNamespace(k_cache=inp.k_cache.clone(), v_cache=None)  # MLA: k_scale only
    k8m, v8m, kwm = v._caches(mla_inp)
    assert v8m is None and "v_scale" not in kwm and kwm["k_scale"] == pytest.approx(kw["k_scale"])
    s = ours.OursPagedFp8(max_smem_bytes=ours.SM120_SMEM_BYTES, tag="sm120")
    assert s.name == "ours_paged@fp8_sm120" and s.tuning().max_smem_bytes == ours.SM120_SMEM_BYTES
    other = types.SimpleNamespace(k_cache=inp.k_cache[:10].clone(), v_cache=inp.v_cache[:10].clone())
    assert v._caches(other)[0].shape[0] == 10  # another row's inputs: their own copies


def test_bench_num_splits_reaches_every_call_of_ours(monkeypatch):
    """bench --num_splits: our paged and flat calls, and the plan the JSON records, get the
    forced split count; 0 passes none (the plan's choice)."""
    import types

    from benchlib import ours

    calls = []

    def record(name):
        def fn(*args, **kw):
            calls.append((name, kw.get("num_splits")))
            return {"name": "stub"}
        return fn

    class Plan:  # TreeAttentionPlan: made with the split count, run per call
        def __init__(self, *args, **kw):
            calls.append(("plan", kw.get("num_splits")))

        def run(self, *args, **kw):
            calls.append(("paged", None))

        def info(self, *args, **kw):
            return {"name": "stub"}

    fake = types.SimpleNamespace(tree_attention_flat=record("flat"), TreeAttentionPlan=Plan,
                                 Tuning=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "verify_attn", fake)
    shape = types.SimpleNamespace(heads=2, d_vo=8)
    case = types.SimpleNamespace(shape=shape, total_q=3, dtype=torch.float32, device="cpu", page_size=1,
                                 tree_mask=None, sm_scale=0.1, max_q_len=2, max_kv_len=5, kv_slot_runs=1,
                                 qo_indptr=None, kv_indptr_pages=None, kv_indices=None, kv_len=None,
                                 kv_indptr_flat=None)
    inputs = types.SimpleNamespace(q=torch.zeros(3, 2, 8), k_cache=torch.zeros(4, 1, 8), v_cache=None,
                                   k_flat=None, v_flat=None)
    for n in (22, 0):
        calls.clear()
        ours.OursPaged(num_splits=n).prepare(case, inputs)()
        ours.OursFlat(num_splits=n).prepare(case, inputs)()
        ours.OursPaged(num_splits=n).plan(case, inputs)
        assert calls == [("plan", n or None), ("paged", None), ("flat", n or None), ("plan", n or None)], calls


def test_short_reason():
    e = RuntimeError("triton.runtime.errors.OutOfResources\nout of resource: shared memory, Required: 368640, "
                     "Hardware limit: 232448.")
    r = short_reason(e)
    assert r.startswith("RuntimeError: out of resource: shared memory")
    assert len(short_reason(ValueError("x" * 1000))) <= 160
    assert short_reason(NotApplicable()) == "NotApplicable"


# ---------------------------------------------------------------------------
# baselines that run on a CPU


def test_flex_mask_mod_matches_reference():
    pytest.importorskip("torch.nn.attention.flex_attention")
    from benchlib.baselines import flex

    for shp in (shapes.Shape("mla", 2, 4, 1, 576, 512, 5, 37, "ddtree"),
                shapes.Shape("gqa", 3, 8, 2, 64, 64, 6, 50, "shuffled", q_lens=(6, 1, 33),
                             prefix_lens=(50, 0, 9))):
        case = inputs.build_case(shp, "cpu", seed=5)
        case.dtype = torch.float32
        s = inputs.make_inputs(case)
        ref = check.reference(case, s)
        f = flex.Flex(compile=False)
        try:
            fn = f.prepare(case, s)
        except RuntimeError as e:  # pragma: no cover - old torch
            pytest.skip(f"flex_attention eager unavailable here: {e}")
        out = fn()
        assert tuple(out.shape) == (case.total_q, shp.heads, shp.d_vo)
        assert check.err_vs_reference(out, case, ref) < 1e-5


def test_flashinfer_says_why():
    from benchlib.baselines import flashinfer

    fi = flashinfer.FlashInferPrefill()
    why = fi.unavailable()
    if not torch.cuda.is_available():
        assert why == "needs CUDA"
    assert fi.applies(type("C", (), {"shape": shapes.mla(1, 16, 16, 4 * K)})())


def test_sglang_not_staged_message(tmp_path):
    from benchlib.baselines import sglang_triton

    with pytest.raises(sglang_triton.NotStaged) as e:
        sglang_triton.load(str(tmp_path))
    assert "run tools/bench/fetch_baselines.sh" in str(e.value)
    ch = sglang_triton.SGLangChain(str(tmp_path))
    assert ch.applies(type("C", (), {"shape": shapes.mla(1, 16, 16, 4 * K), "uniform_q": True})())


@pytest.mark.parametrize("model", ["mla", "gqa"])
def test_sglang_fp8_column_passes_the_fp8_copies_and_scales(model):
    """sglang_extend@fp8: extend_attention_fwd gets the fp8 copies ours_paged@fp8
    reads (one quantization per input set, benchlib.fp8), as [slots, Hkv, D]
    buffers (MLA: the value buffer the latent one's first 512 columns), the
    drafts' K / V in q's dtype, and the scales (MLA: k_scale for both)."""
    import types

    from benchlib import fp8, inputs, ours
    from benchlib.baselines import sglang_triton as st

    shp = (shapes.Shape("mla", 2, 4, 1, 576, 512, 5, 37, "ddtree") if model == "mla"
           else shapes.Shape("gqa", 3, 8, 2, 64, 64, 6, 50, "random"))
    case = inputs.build_case(shp, "cpu", page_size=4, seed=3)
    s = inputs.make_inputs(case)
    seen = {}
    impl = st.SGLangExtendFp8("/nonexistent")
    impl._mods = (types.SimpleNamespace(extend_attention_fwd=lambda *a, **kw: seen.update(a=a, kw=kw)), None, None)
    impl.prepare(case, s)()
    a = seen["a"]
    k8, ks, v8, vs = fp8.SHARED.get(s)
    assert a[4].dtype == a[5].dtype == torch.float8_e4m3fn and a[4].shape == s.k_slots.shape
    assert a[4].data_ptr() == k8.data_ptr() and a[1] is s.k_ext and a[2] is s.v_ext
    if model == "mla":
        assert v8 is None and a[5].data_ptr() == k8.data_ptr() and a[5].shape[-1] == 512 and a[-2:] == (ks, ks)
    else:
        assert a[5].data_ptr() == v8.data_ptr() and a[-2:] == (ks, vs)
    assert ours.OursPagedFp8()._caches(s)[0] is k8  # ours@fp8 reads the same bytes
    assert impl.name == "sglang_extend@fp8" and impl.tol > ours.OursPagedFp8.tol


@pytest.mark.skipif(os.environ.get("VERIFY_ATTN_TEST_SGLANG_INTERPRET") != "1",
                    reason="opt-in: SGLang's staged kernels under the Triton interpreter (slow)")
def test_sglang_kernels_under_triton_interpreter():
    """Runs in a subprocess: TRITON_INTERPRET must be set before Triton is imported."""
    bench = os.path.dirname(os.path.dirname(os.path.abspath(shapes.__file__)))  # tools/bench
    staged = os.environ.get("VERIFY_ATTN_BASELINES_DIR",
                            os.path.join(os.path.dirname(os.path.dirname(bench)), ".gpu_stage", "baselines"))
    if not os.path.isdir(os.path.join(staged, "sglang")):
        pytest.skip(f"no staged baselines in {staged}")
    code = f"""
import os, torch
os.environ["TRITON_INTERPRET"] = "1"
from benchlib.baselines import sglang_triton as st
from benchlib import inputs, shapes, check
mods = st.load({staged!r})
worst = 0.0
for shp in [shapes.Shape("mla", 2, 4, 1, 576, 512, 5, 37, "ddtree"),
            shapes.Shape("gqa", 3, 8, 2, 64, 64, 6, 50, "random"),
            shapes.Shape("mla", 2, 4, 1, 576, 512, 8, 40, "chain")]:
    case = inputs.build_case(shp, "cpu", page_size=4, seed=3)
    case.dtype = torch.float32
    s = inputs.make_inputs(case)
    ref = check.reference(case, s)
    impls = [st.SGLangExtend({staged!r})] + ([st.SGLangChain({staged!r})] if shp.is_chain else [])
    for impl in impls:
        impl._mods = mods
        out = impl.prepare(case, s)()
        worst = max(worst, check.err_vs_reference(out, case, ref))
print("WORST", worst)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([bench] + sys.path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    worst = float(r.stdout.split("WORST")[-1])
    assert worst < 1e-2


# ---------------------------------------------------------------------------
# workload=real adapter


def test_fixture_case_adapter(monkeypatch, tmp_path):
    c = {"name": "cap0", "num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 64,
         "q_lens": [3, 2], "prefix_lens": [10, 4], "parents": [-1, 0, 0, -1, 0]}
    s = workload.case_to_shape(c)
    assert s.name == "cap0" and s.model == "gqa" and s.parents == ((-1, 0, 0), (-1, 0))
    assert s.request_q_lens() == [3, 2] and s.request_prefix_lens() == [10, 4]

    class Obj:
        heads = 16
        kv_heads = 1
        head_dim_qk = 576
        qo_indptr = [0, 4]
        kv_lens = [104]
        parents = [[-1, 0, 1, 1]]

    s2 = workload.case_to_shape(Obj(), 3)
    assert s2.mla and s2.d_vo == 512 and s2.prefix_lens == (100,) and s2.name.startswith("real#3")
    with pytest.raises(ValueError):
        workload.case_to_shape({"heads": 4})
    # no fixture anywhere (the GPU run exports VERIFY_ATTN_REAL_FIXTURE: point it nowhere)
    monkeypatch.setenv("VERIFY_ATTN_REAL_FIXTURE", os.path.join(str(tmp_path), "missing.safetensors"))
    with pytest.raises(workload.FixtureUnavailable):
        workload.load_shapes("")


# ---------------------------------------------------------------------------
# the whole pipeline: tools/bench/bench.py --dry_run (and no-GPU behaviour)


def _bench_py():
    bench = os.path.dirname(os.path.dirname(os.path.abspath(shapes.__file__)))  # tools/bench
    return os.path.join(bench, "bench.py")


def _run_bench(args, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OUT="")
    env.pop("OUT")
    return subprocess.run([sys.executable, _bench_py()] + args, env=env, capture_output=True, text=True,
                          timeout=600, cwd=str(tmp_path))


def test_bench_dry_run(tmp_path):
    j = tmp_path / "r.json"
    r = _run_bench(["--dry_run", "--shapes=gqa B3,mla B1 H2", f"--json_out={j}", "--noprogress"], tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "torch ref" in r.stdout and "gqa B3 H8/2 D64 T6 L50 random" in r.stdout
    data = json.loads(j.read_text())
    assert data["options"]["dry_run"] is True and len(data["rows"]) == 2
    for row in data["rows"]:
        assert row["check"] == "ref"
        t = row["impls"]["torch_ref"]
        assert t["status"] == "ok" and t["err_ref"] < 1e-4 and t["eager"]["median_us"] > 0
        assert row["basis"]["impl"] == "torch_ref"
    assert (tmp_path / "r.png").exists()


def test_bench_list(tmp_path):
    r = _run_bench(["--list", "--grid=full", "--shapes=ddtree"], tmp_path)
    assert r.returncode == 0
    assert "mla B1 H16 T1024 L8k ddtree" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_bench_without_gpu_exits_2(tmp_path):
    r = _run_bench(["--shapes=mla B1 H16 T16 L4k"], tmp_path)
    assert r.returncode == 2
    assert "needs an NVIDIA GPU" in r.stderr


# ---------------------------------------------------------------------------
# SGLang's attention backends (--baselines=sglang_backend): CPU-side behaviour


def _backend_impl(label, eager_us, status="ok", err=2e-3):
    return {"label": label, "status": status, "eager": _timing(eager_us, "eager"), "graph": None,
            "graph_error": None, "err_ref": err, "err_vs_ours": err / 2, "competitor": False}


def test_sglang_backend_adapters_not_staged(tmp_path, monkeypatch):
    from benchlib.baselines import sglang_backend as sb

    ads = sb.adapters(str(tmp_path / "missing"))
    assert [a.name for a in ads] == ["sglang_backend_ours", "sglang_backend_triton"]
    assert [a.label for a in ads] == ["SGLang backend: verify_attn", "SGLang backend: triton"]
    assert [a.backend_name for a in ads] == ["verify_attn", "triton"]
    for a in ads:
        assert not a.competitor and not a.graphable and a.check_vs_ours
    # a missing folder, a folder without an installed SGLang, and no site at all
    empty = tmp_path / "empty_site"
    empty.mkdir()
    monkeypatch.delenv(sb.SITE_ENV, raising=False)
    monkeypatch.setattr(sb, "_sglang_on_path", lambda: False)
    for site in (str(tmp_path / "missing"), str(empty), None):
        for a in sb.adapters(site):
            why = a.unavailable()
            assert why.startswith("not staged") and "integration/sglang/stage.sh" in why, why
            assert report._absent({"status": "unavailable", "reason": why}) == "not staged"
            with pytest.raises(RuntimeError, match="not staged"):
                a._get_setup(object())
    # the site's default comes from the environment
    monkeypatch.setenv(sb.SITE_ENV, str(empty))
    assert sb.SGLangBackendOurs().site == str(empty)
    assert sb.SGLangBackendOurs(str(tmp_path)).site == str(tmp_path)
    # a site with an SGLang in it: on a machine without CUDA, nothing is imported
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("raise ImportError('must not be imported on CPU')\n")
    assert sb.resolve_site(str(site)) == (str(site), None)
    if not torch.cuda.is_available():
        assert sb.SGLangBackendTriton(str(site)).unavailable().startswith("needs CUDA")
        assert "sglang" not in sys.modules or not str(getattr(sys.modules["sglang"], "__file__", "")).startswith(
            str(site))
    # applies(): target verify needs one q_len per request
    ragged = type("C", (), {"uniform_q": False, "max_q_len": 4, "device": "cuda"})()
    assert "one q_len" in sb.SGLangBackendOurs(None).applies(ragged)
    cpu_case = type("C", (), {"uniform_q": True, "max_q_len": 4, "device": "cpu"})()
    assert sb.SGLangBackendOurs(None).applies(cpu_case) == "needs CUDA"


def test_sglang_backend_unavailable_through_runner(tmp_path, monkeypatch):
    from benchlib.baselines import sglang_backend as sb
    from benchlib.baselines import torch_ref

    monkeypatch.setattr(sb, "_sglang_on_path", lambda: False)
    shp = shapes.dry_grid()[0]
    opts = runner.Options(device="cpu", graph=False, rotate=False, warmup=1, target_ms=1.0, min_iters=1,
                          max_iters=2)
    impls = [torch_ref.TorchReference()] + sb.adapters(str(tmp_path / "nothing"))
    rows = runner.run_all([shp], impls, opts, floor.nominal_ceilings())
    imp = rows[0]["impls"]
    assert imp["torch_ref"]["status"] == "ok"
    for k in ("sglang_backend_ours", "sglang_backend_triton"):
        assert imp[k]["status"] == "unavailable" and imp[k]["reason"].startswith("not staged")
    assert "sglang_backend_ours" not in rows[0]["speedup"]
    text = report.render(rows, {"card": "cpu"})
    assert "SGL-be ours" in text and "SGL-be Triton" in text and "not staged" in text
    assert report.integration_ratios(rows[0])["x_sgl_backend"] is None


_BENCH_MODULE = []


def _bench_module():
    """tools/bench/bench.py as a module, loaded once (its absl flags register globally)."""
    if not _BENCH_MODULE:
        import importlib.util

        spec = importlib.util.spec_from_file_location("va_bench_main_for_test", _bench_py())
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        _BENCH_MODULE.append(bench)
    return _BENCH_MODULE[0]


def test_bench_baselines_flag_sglang_backend(tmp_path):
    bench = _bench_module()
    try:
        assert "sglang_backend" not in bench.FLAGS["baselines"].default
        bench.FLAGS(["bench", "--baselines=sglang_backend,sglang_extend,flex",
                     f"--sglang_site={tmp_path / 'no_site'}"])
        impls = bench.build_impls(False, str(tmp_path / "no_baselines"))
        # the SGLang backends come last whatever the order of --baselines
        assert [i.name for i in impls] == ["ours_paged", "ours_flat", "sglang_extend", "flex",
                                           "sglang_backend_ours", "sglang_backend_triton"]
        assert impls[-1].site == str(tmp_path / "no_site") == bench.sglang_site()
        assert impls[-1].unavailable().startswith("not staged")
    finally:
        bench.FLAGS.unparse_flags()


def test_report_sglang_backend_columns(tmp_path):
    s1, s2, s3 = shapes.mla(1, 16, 16, 4 * K), shapes.gqa(16, 16, 8 * K), shapes.gqa(64, 4, 1 * K)
    ceil = floor.nominal_ceilings()
    r1 = _fake_row(s1, ours_g=40.0, ours_e=60.0, ext_g=520.0, ext_e=600.0)
    r1["impls"]["sglang_backend_ours"] = _backend_impl("SGLang backend: verify_attn", 75.0)
    r1["impls"]["sglang_backend_triton"] = _backend_impl("SGLang backend: triton", 600.0)
    runner.summarize(r1, s1, ceil)
    r2 = _fake_row(s2, ours_g=90.0, ours_e=100.0, ext_g=900.0, ext_e=950.0)
    r2["impls"]["sglang_backend_ours"] = _backend_impl("SGLang backend: verify_attn", 130.0, status="wrong")
    r2["impls"]["sglang_backend_triton"] = {"label": "SGLang backend: triton", "status": "failed",
                                            "reason": "RuntimeError: boom", "competitor": False}
    runner.summarize(r2, s2, ceil)
    r3 = _fake_row(s3, ours_g=20.0, ours_e=25.0, ext_g=50.0, ext_e=55.0)
    why = "not staged (run integration/sglang/stage.sh and ...)"
    for k, lab in (("sglang_backend_ours", "SGLang backend: verify_attn"),
                   ("sglang_backend_triton", "SGLang backend: triton")):
        r3["impls"][k] = {"label": lab, "status": "unavailable", "reason": why}
    runner.summarize(r3, s3, ceil)
    # not speedups over our kernel: their own columns
    for r in (r1, r2, r3):
        assert not any(k.startswith("sglang_backend") for k in r["speedup"])
    x = report.integration_ratios(r1)
    assert x["x_sgl_backend"] == pytest.approx(8.0) and x["overhead"] == pytest.approx(1.25)
    assert x["ours_backend_us"] == 75.0 and x["ours_kernel_us"] == 60.0 and x["wrong"] == []
    x2 = report.integration_ratios(r2)
    assert x2["x_sgl_backend"] is None and x2["overhead"] == pytest.approx(1.3)
    assert x2["wrong"] == ["sglang_backend_ours"]
    assert report.integration_ratios(r3)["overhead"] is None
    assert report.integration_ratios(_fake_row(s1, 40.0, 60.0, 520.0, 600.0)) is None
    h, body = report.floor_table([r1, r2, r3])
    assert "xSGL-backend" in h and "overhead" in h
    i, j = h.index("xSGL-backend"), h.index("overhead")
    assert (body[0][i], body[0][j]) == ("8.00x", "1.25x")
    assert (body[1][i], body[1][j]) == ("FAIL", "1.30x!")  # ours wrong; Triton failed
    assert (body[2][i], body[2][j]) == ("not staged", "not staged")
    th, tb = report.time_table([r1, r2, r3])
    assert "SGL-be ours" in th and "SGL-be Triton" in th
    assert tb[0][th.index("SGL-be ours")] == "75.0e" and tb[0][th.index("SGL-be Triton")] == "600e"
    assert tb[1][th.index("SGL-be ours")] == "130e WRONG" and tb[1][th.index("SGL-be Triton")] == "FAIL"
    text = report.render([r1, r2, r3], {"card": "NVIDIA H200 (fake)"})
    assert "xSGL-backend" in text and "overhead = our plugin backend" in text
    assert "SGLang backend: triton: failed: RuntimeError: boom" in text
    assert "SGLang backend: verify_attn: not staged" in text
    # without the backend rows the table keeps its old columns
    h0, _ = report.floor_table([_fake_row(s1, 40.0, 60.0, 520.0, 600.0)])
    assert "xSGL-backend" not in h0 and "overhead" not in h0
    assert "x_sgl_backend" in report.CONVENTIONS and "overhead" in report.CONVENTIONS
    p = tmp_path / "b.json"
    for r in (r1, r2, r3):
        r["sglang_backend"] = report.integration_ratios(r)
    report.write_json(str(p), {"rows": [r1, r2, r3]})
    data = json.loads(p.read_text())
    assert data["rows"][0]["sglang_backend"]["x_sgl_backend"] == pytest.approx(8.0)
    assert report.plot([r1, r2, r3], str(tmp_path / "b.png"))


# ---------------------------------------------------------------------------
# FlashMLA (--baselines=flashmla): the chain-only baseline, CPU-side behaviour


def _fake_flash_mla():
    """A stand-in ``flash_mla`` module computing upstream's documented dense decode in
    float32 from the paged inputs: block table gather, ``causal=True`` bottom-right
    aligned (query t of s_q sees KV rows 0 .. seqlen - s_q + t)."""
    import types

    calls = {"n": 0}

    def get_mla_metadata(*args, **kwargs):
        return types.SimpleNamespace(tile_scheduler_metadata=None, num_splits=None), None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits=None, softmax_scale=None, causal=False, use_legacy=False):
        assert use_legacy and causal and num_splits is None and head_dim_v == 512
        B, T, H, D = q.shape
        assert k_cache.shape[1:] == (64, 1, D) and block_table.dtype == torch.int32
        assert cache_seqlens.dtype == torch.int32 and tuple(cache_seqlens.shape) == (B,)
        calls["n"] += 1
        out = torch.empty(B, T, H, head_dim_v, dtype=q.dtype)
        lse = torch.empty(B, H, T)
        for b in range(B):
            n = int(cache_seqlens[b])
            kb = k_cache[block_table[b].long()].reshape(-1, D)[:n].float()
            s = torch.einsum("thd,kd->thk", q[b].float(), kb) * softmax_scale
            vis = torch.arange(n)[None, :] <= (n - T + torch.arange(T))[:, None]
            s = s.masked_fill(~vis[:, None, :], float("-inf"))
            out[b] = torch.einsum("thk,kd->thd", torch.softmax(s, -1), kb[:, :head_dim_v]).to(q.dtype)
            lse[b] = torch.logsumexp(s, -1).transpose(0, 1)
        return out, lse

    return types.SimpleNamespace(get_mla_metadata=get_mla_metadata,
                                 flash_mla_with_kvcache=flash_mla_with_kvcache, __version__="fake", calls=calls)


@pytest.mark.parametrize("page_size", [1, 64])
def test_flashmla_input_builder(page_size):
    from benchlib.baselines import flashmla

    shp = shapes.Shape("mla", 3, 2, 1, 576, 512, 5, 70, "ddtree")   # kv_len 75: two 64-row blocks each
    case = inputs.build_case(shp, "cpu", page_size=page_size, seed=4)
    s = inputs.make_inputs(case)
    fi = flashmla.build_inputs(case, s)
    assert tuple(fi.q.shape) == (3, 5, 2, 576) and fi.q.data_ptr() == s.q.data_ptr()   # a view
    assert torch.equal(fi.q.reshape(-1, 2, 576), s.q)
    assert fi.k_cache.dim() == 4 and tuple(fi.k_cache.shape[1:]) == (64, 1, 576)
    assert fi.block_table.dtype == torch.int32 and tuple(fi.block_table.shape) == (3, 2)
    assert fi.cache_seqlens.dtype == torch.int32 and fi.cache_seqlens.tolist() == [75, 75, 75]
    ids = fi.block_table.flatten().tolist()
    assert len(set(ids)) == len(ids) and 0 <= min(ids) and max(ids) < fi.k_cache.shape[0]
    kvp = case.kv_indptr_flat.tolist()
    for i in range(3):
        rows = fi.k_cache[fi.block_table[i].long()].reshape(-1, 1, 576)
        assert torch.equal(rows[:75], s.k_flat[kvp[i]:kvp[i + 1]])   # prefix, then the drafts
        if page_size == 1:
            assert not rows[75:].any()     # the tail of the last block: zeros
    if page_size == 64:
        assert fi.shared_cache and fi.k_cache.data_ptr() == s.k_cache.data_ptr()
        assert ids == case.kv_indices.tolist()
    else:
        assert not fi.shared_cache and fi.k_cache.shape[0] == 6 + 1   # 5% slack, at least one block
        assert ids != sorted(ids) or len(ids) < 3                     # scattered
    # ragged lengths, GQA: not FlashMLA's problem
    rag = inputs.build_case(shapes.Shape("mla", 2, 2, 1, 576, 512, 4, 9, "chain", q_lens=(4, 2),
                                         prefix_lens=(9, 9)), "cpu")
    with pytest.raises(NotApplicable):
        flashmla.build_inputs(rag, inputs.make_inputs(rag))
    g = inputs.build_case(shapes.Shape("gqa", 1, 4, 2, 64, 64, 3, 9, "chain"), "cpu")
    with pytest.raises(NotApplicable):
        flashmla.build_inputs(g, inputs.make_inputs(g))
    impl = flashmla.FlashMLAChain(None)
    assert impl.applies(g).startswith("MLA only") and "one q_len" in impl.applies(rag)
    assert impl.applies(case) is None


def test_flashmla_chain_through_runner_and_report(monkeypatch):
    """FlashMLA (a CPU stand-in with the same call) on tree, chain and GQA rows: checked against
    the CHAIN reference on tree rows, n/a on GQA, its two columns rendered."""
    from benchlib.baselines import flashmla, torch_ref

    fake = _fake_flash_mla()
    impl = flashmla.FlashMLAChain(None)
    impl._fm = fake
    monkeypatch.setattr(impl, "unavailable", lambda: None)
    tree, chain = shapes.Shape("mla", 2, 4, 1, 576, 512, 5, 37, "ddtree"), shapes.dry_grid()[1]
    gqa = shapes.dry_grid()[2]
    opts = runner.Options(device="cpu", graph=False, rotate=False, warmup=1, target_ms=1.0, min_iters=1,
                          max_iters=2)
    rows = runner.run_all([tree, chain, gqa], [torch_ref.TorchReference(), impl], opts,
                          floor.nominal_ceilings())
    rt, rc, rg = rows
    ft, fc, fg = (r["impls"]["flashmla"] for r in rows)
    assert ft["status"] == "ok" and ft["computes"] == "chain" and ft["check"] == "chain ref"
    assert ft["err_ref"] < 1e-2 and ft["err_vs_ours"] is None and rt["check_chain"] == "chain ref"
    assert rt["speedup"]["flashmla"]["baseline_computes"] == "causal chain of the same shape"
    assert fc["status"] == "ok" and fc["err_ref"] < 1e-2 and "check" not in fc and "check_chain" not in rc
    assert "baseline_computes" not in rc["speedup"]["flashmla"]
    assert fg["status"] == "n/a" and "MLA only" in fg["reason"]
    assert fake.calls["n"] >= 3
    # the chain reference really differs from the tree's on the tree row
    case = inputs.build_case(tree, "cpu", seed=0)
    s = inputs.make_inputs(case)
    out = impl.prepare(case, s)()
    assert tuple(out.shape) == (case.total_q, 4, 512)
    assert check.err_vs_reference(out, case, check.reference(case, s, causal=True)) < 1e-2
    assert check.err_vs_reference(out, case, check.reference(case, s)) > 5e-2
    # the report: time column, ratio column (FlashMLA / ours), n/a on GQA, the note
    th, tb = report.time_table(rows)
    j = th.index("FlashMLA chain us")
    assert tb[2][j] == "n/a" and tb[0][j].endswith("e")
    fh, fb = report.floor_table(rows)
    k = fh.index("tree/FMLA-chain")
    want = ft["eager"]["median_us"] / rt["impls"]["torch_ref"]["eager"]["median_us"]
    assert fb[0][k] == report._fmt_x(want) and fb[2][k] == "n/a"
    text = report.render(rows, {"card": "cpu"})
    assert report.FLASHMLA_NOTE in text and "tree/FMLA-chain" in report.CONVENTIONS


def test_dense_baseline_through_runner_and_report():
    """The dense FlashAttention-2 baseline (its MATH backend on the CPU): on a GQA row it is
    checked against the reference of the unmasked problem, not the tree's; n/a on MLA rows;
    its columns and speedup rendered."""
    from torch.nn.attention import SDPBackend

    from benchlib.baselines import sdpa, torch_ref

    impl = sdpa.SdpaFlashDense(backends=[SDPBackend.MATH])
    gqa = shapes.Shape("gqa", 3, 8, 2, 64, 64, 6, 50, "ddtree")
    mla = shapes.dry_grid()[0]
    opts = runner.Options(device="cpu", graph=False, rotate=False, warmup=1, target_ms=1.0, min_iters=1,
                          max_iters=2)
    rows = runner.run_all([gqa, mla], [torch_ref.TorchReference(), impl], opts, floor.nominal_ceilings())
    rg, rm = rows
    fg, fm = rg["impls"]["sdpa_flash"], rm["impls"]["sdpa_flash"]
    assert fg["status"] == "ok" and fg["computes"] == "dense" and fg["check"] == "dense ref", fg
    assert fg["err_ref"] < 1e-2 and fg["err_vs_ours"] is None and rg["check_dense"] == "dense ref"
    assert rg["speedup"]["sdpa_flash"]["baseline_computes"].startswith("unmasked problem")
    assert fm["status"] == "n/a" and "head dims 576/512" in fm["reason"]
    case = inputs.build_case(gqa, "cpu", seed=0)
    s = inputs.make_inputs(case)
    out = impl.prepare(case, s)()
    assert tuple(out.shape) == (case.total_q, 8, 64)
    assert check.err_vs_reference(out, case, check.reference(case, s, dense=True)) < 1e-2
    assert check.err_vs_reference(out, case, check.reference(case, s)) > 5e-2  # the tree differs
    fh, fb = report.floor_table(rows)
    k = fh.index("xFA2-dense")
    want = fg["eager"]["median_us"] / rg["impls"]["torch_ref"]["eager"]["median_us"]
    assert fb[0][k] == report._fmt_x(want) and fb[1][k] == "n/a"
    th, _ = report.time_table(rows)
    assert "FA2 dense us" in th
    ragged = shapes.Shape("gqa", 2, 8, 2, 64, 64, 6, 50, "ddtree", q_lens=(6, 3), prefix_lens=(50, 50))
    assert "ragged" in impl.applies(inputs.build_case(ragged, "cpu", seed=0))


def test_sm120_column_mma_ceiling_and_portable_table(tmp_path):
    """bench --sm120: our paged kernel planned under sm_120's shared memory (Tuning
    max_smem_bytes=101376) as the column ours_paged@sm120; the mma.sync ceiling read from
    its binary; %mma and the portable table."""
    import verify_attn

    from benchlib import ours

    v = ours.OursPaged(max_smem_bytes=ours.SM120_SMEM_BYTES, tag="sm120")
    assert v.name == "ours_paged@sm120" and v.check_vs_ours
    assert v.tuning() == verify_attn.Tuning(max_smem_bytes=101376)
    # the ceiling binary: missing, failing, and one printing the line mma_peak prints
    rate, why = floor.measure_mma_sync(str(tmp_path / "nope"))
    assert rate is None and "no mma.sync ceiling binary" in why
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho 'mma_peak: no device' >&2\nexit 1\n")
    bad.chmod(0o755)
    rate, why = floor.measure_mma_sync(str(bad))
    assert rate is None and "exited 1: mma_peak: no device" in why
    good = tmp_path / "good"
    good.write_text("#!/bin/sh\necho '{\"device\": \"x\", \"sms\": 132, \"iters\": 4096, "
                    "\"mma_sync_tflops\": 630.5, \"configs\": {\"w8_b2\": 630.5}}'\n")
    good.chmod(0o755)
    rate, why = floor.measure_mma_sync(str(good))
    assert why is None and rate == pytest.approx(630.5e12)
    ceil = floor.nominal_ceilings()
    shape = shapes.mla(1, 16, 64, 32 * K)
    assert floor.metrics(shape, 1e-3, ceil)["frac_mma"] is None
    ceil.mma_sync_flop_per_s = rate
    m = floor.metrics(shape, 1e-3, ceil)
    assert m["frac_mma"] == pytest.approx(floor.flops(shape) / 1e-3 / rate)
    # the portable table from a row with the three columns
    row = _fake_row(shape, 150.0, 160.0, 4000.0, 4100.0)
    row["impls"]["ours_paged@sm120"] = {
        "label": "verify_attn paged @sm120", "status": "ok", "competitor": False, "err_ref": 2e-3,
        "eager": _timing(900.0, "eager"), "graph": _timing(866.0, "graph"), "plan": "mma_sync_bf16_mla_m32n32_s1"}
    runner.summarize(row, shape, ceil)
    h, b = report.portable_table([row])
    cells = dict(zip(h, b[0]))
    assert cells["sm120 config"] == "mma_sync_bf16_mla_m32n32_s1" and cells["sm120 us"] == "866g"
    assert cells["sm120 %mma"] == report._fmt_pct(floor.flops(shape) / 866e-6 / rate)
    assert cells["FA2 dense us"] == "--" and cells["xFA2 sm120"] == "--"
    assert report.portable_table([_fake_row(shape, 1.0, 2.0, 3.0, 4.0)])[1] == []
    assert "mma.sync ceiling" in report.render([row], {"card": "cpu"})


def test_flashmla_unavailable_cells(tmp_path, monkeypatch):
    from benchlib.baselines import flashmla, torch_ref

    monkeypatch.delenv(flashmla.SITE_ENV, raising=False)
    monkeypatch.setattr(flashmla.importlib.util, "find_spec", lambda name, *a: None)
    impl = flashmla.FlashMLAChain(str(tmp_path / "no_baselines"))
    why = impl.unavailable()
    assert why.startswith("unavailable: not staged") and "VERIFY_ATTN_STAGE_FLASHMLA=1" in why, why
    assert report._absent({"status": "unavailable", "reason": why}) == "unavailable"
    # staged but no CUDA here (or not an SM90): still a clean 'unavailable'
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "sgl_flash_mla-1.0.0-cp310-abi3-manylinux2014_x86_64.whl").write_bytes(b"")
    if not torch.cuda.is_available():
        assert flashmla.FlashMLAChain(str(tmp_path / "st")).unavailable() == "unavailable: needs CUDA"
    opts = runner.Options(device="cpu", graph=False, rotate=False, warmup=1, target_ms=1.0, min_iters=1,
                          max_iters=2)
    mla, gqa = shapes.dry_grid()[1], shapes.dry_grid()[2]
    rows = runner.run_all([mla, gqa], [torch_ref.TorchReference(), impl], opts, floor.nominal_ceilings())
    assert rows[0]["impls"]["flashmla"]["status"] == "unavailable"
    assert rows[1]["impls"]["flashmla"]["status"] == "n/a"      # GQA: n/a, staged or not
    th, tb = report.time_table(rows)
    j = th.index("FlashMLA chain us")
    assert (tb[0][j], tb[1][j]) == ("unavailable", "n/a")
    fh, fb = report.floor_table(rows)
    k = fh.index("tree/FMLA-chain")
    assert (fb[0][k], fb[1][k]) == ("unavailable", "n/a")
    assert "flashmla" not in rows[0]["speedup"]
    text = report.render(rows, {"card": "cpu"})
    assert "FlashMLA dense decode (causal chain): unavailable: not staged" in text


def _fake_wheel(path, init_py):
    """A minimal ``sgl_flash_mla`` wheel holding ``flash_mla/__init__.py`` (for pip --target)."""
    import base64
    import hashlib
    import zipfile

    files = {
        "flash_mla/__init__.py": init_py,
        "sgl_flash_mla-0.0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: sgl-flash-mla\nVersion: 0.0.1\n",
        "sgl_flash_mla-0.0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        d = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={d},{len(text.encode())}")
    record.append("sgl_flash_mla-0.0.1.dist-info/RECORD,,")
    files["sgl_flash_mla-0.0.1.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return str(path)


def test_flashmla_install_and_probe(tmp_path, monkeypatch):
    """The staged wheel is installed with pip --target and imported in a child process
    first; an import that aborts the child makes the column unavailable, not the bench."""
    import importlib.util

    from benchlib.baselines import flashmla

    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not installed in this interpreter")
    monkeypatch.delenv(flashmla.SITE_ENV, raising=False)
    good = tmp_path / "good"
    good.mkdir()
    _fake_wheel(good / "sgl_flash_mla-0.0.1-py3-none-any.whl",
                "__version__ = '0.0.1'\ndef has_legacy():\n    return True\n")
    assert flashmla.find_wheel(str(good)).endswith("sgl_flash_mla-0.0.1-py3-none-any.whl")
    assert flashmla.find_wheel(str(tmp_path)) is None
    root = tmp_path / "sites"
    site = flashmla.install(flashmla.find_wheel(str(good)), str(root))
    assert os.path.isfile(os.path.join(site, "flash_mla", "__init__.py"))
    assert flashmla.install(flashmla.find_wheel(str(good)), str(root)) == site   # kept, not reinstalled
    assert flashmla.probe(site, run_kernel=False) is None
    bad = tmp_path / "bad"
    bad.mkdir()
    _fake_wheel(bad / "sgl_flash_mla-0.0.1-py3-none-any.whl", "import os\nos.abort()\n")
    bad_site = flashmla.install(flashmla.find_wheel(str(bad)), str(tmp_path / "bad_sites"))
    why = flashmla.probe(bad_site, run_kernel=False)
    assert why.startswith("import flash_mla failed in a child process (killed by signal"), why
    nolegacy = tmp_path / "nolegacy"
    nolegacy.mkdir()
    _fake_wheel(nolegacy / "sgl_flash_mla-0.0.1-py3-none-any.whl",
                "def has_legacy():\n    return False\n")
    nl_site = flashmla.install(flashmla.find_wheel(str(nolegacy)), str(tmp_path / "nl_sites"))
    assert "legacy extension" in flashmla.probe(nl_site, run_kernel=False)
    # load(): through $VERIFY_ATTN_FLASHMLA_SITE, the bad one stays unavailable (and is remembered)
    monkeypatch.setenv(flashmla.SITE_ENV, bad_site)
    with pytest.raises(flashmla.Unavailable, match="killed by signal"):
        flashmla.load(None, run_kernel=False)
    with pytest.raises(flashmla.Unavailable, match="killed by signal"):
        flashmla.load(None, run_kernel=False)
    monkeypatch.setenv(flashmla.SITE_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(flashmla.Unavailable, match="holds no flash_mla"):
        flashmla.load(None, run_kernel=False)
    flashmla._LOADED.clear()


def test_bench_baselines_flag_flashmla(tmp_path):
    bench = _bench_module()
    try:
        assert "flashmla" in bench.FLAGS["baselines"].default
        assert "flashmla" in bench.FLAGS["baselines"].help
        bench.FLAGS(["bench", "--baselines=flashmla"])
        impls = bench.build_impls(False, str(tmp_path / "no_baselines"))
        assert [i.name for i in impls] == ["ours_paged", "ours_flat", "flashmla"]
        assert impls[-1].baselines_dir == str(tmp_path / "no_baselines")
        assert impls[-1].computes == "chain" and impls[-1].competitor
    finally:
        bench.FLAGS.unparse_flags()


# ---------------------------------------------------------------------------
# flag validation: usage errors up front (rc 2, naming the flag), before any
# shape is selected, a ceiling measured or the GPU touched


@pytest.mark.parametrize("args,match", [
    (["--time_budget_s=-5"], "--time_budget_s: must be > 0"),
    (["--time_budget_s=0"], "--time_budget_s: must be > 0"),
    (["--time_budget_s=nan"], "--time_budget_s: must be > 0"),
    (["--warmup=-1"], "--warmup: must be >= 0"),
    (["--target_ms=0"], "--target_ms: must be > 0"),
    (["--target_ms=-3"], "--target_ms: must be > 0"),
    (["--target_ms=nan"], "--target_ms: must be > 0"),
    (["--min_iters=0"], "--min_iters: must be >= 1"),
    (["--min_iters=50", "--max_iters=10"], "--min_iters: must be <= --max_iters"),
    (["--baselines=flex,nope"], "--baselines: unknown 'nope'; expected some of sglang_extend, sglang_chain, "
                                "flex, flashinfer, flashmla, sdpa_flash, sglang_backend"),
    (["--page_size=0"], "--page_size: must be >= 1"),
    (["--kv_slot_runs_hint=-1"], "--kv_slot_runs_hint: must be >= 0"),
    (["--page_size=64", "--kv_slot_runs_hint=64"], "--kv_slot_runs_hint: must be >= 0 (0 or 1: no hint), and <= 1"),
    (["--compare_configs=mla_m32n32_s1,bogus"], "--compare_configs: unknown 'bogus'; expected some of "
                                                "mla_m32n32_s1, gqa_d64_m64n64_s2, gqa_d128_m64n64_s2"),
    (["--num_splits=-1"], "--num_splits: must be in [0, 65535] (got -1)"),
    (["--num_splits=65536"], "--num_splits: must be in [0, 65535] (got 65536)"),
    (["--compare_balance=on,maybe"], "--compare_balance: 'on' and / or 'off', each once (got on,maybe)"),
    (["--compare_balance=off,off"], "--compare_balance: 'on' and / or 'off', each once (got off,off)"),
])
def test_bench_flag_errors(args, match):
    bench = _bench_module()
    try:
        bench.FLAGS(["bench"] + args)
        errs = bench.flag_errors()
        assert len(errs) == 1 and errs[0].startswith(match), errs
    finally:
        bench.FLAGS.unparse_flags()


@pytest.mark.parametrize("args,hint,expect", [
    ([], None, 8),                                   # --slot_runs passed as the hint, as SGLang does
    (["--hint_slot_runs=false"], 1, 1),              # the same slots without it
    (["--kv_slot_runs_hint=64"], 64, 64),            # tuning: a hint the slots do not hold
    (["--hint_slot_runs=false", "--kv_slot_runs_hint=0"], 0, 0),
])
def test_bench_kv_slot_runs_hint(args, hint, expect):
    """One hint reaches verify_attn (Case.kv_slot_runs): --kv_slot_runs_hint over --hint_slot_runs."""
    bench = _bench_module()
    try:
        bench.FLAGS(["bench", "--page_size=1", "--slot_runs=8"] + args)
        assert bench.flag_errors() == []
        assert bench.kv_slot_runs_hint() == hint
        shp = shapes.Shape("mla", 2, 2, 1, 576, 512, 5, 9, "ddtree")
        case = inputs.build_case(shp, "cpu", page_size=1, seed=3, slot_runs=8, kv_slot_runs_hint=hint)
        assert case.kv_slot_runs == expect
    finally:
        bench.FLAGS.unparse_flags()


def test_bench_known_configs_are_the_plans_tags():
    """--compare_configs is checked against the plan's own tag list (C-ABI
    va_config_tags, through runtime_info; the extension loads without a GPU)."""
    import verify_attn

    tags = verify_attn.runtime_info()["config_tags"]
    assert len(tags) == len(set(tags)) == 15, tags
    assert {"mla_m32n32_s1", "mla_split_m32n32", "mla_cluster_m64n32", "mla_wgmma_m64n64_pipe_rows", "mla_wgmma_seesaw_tma",
            "gqa_d128_m64n64_s2", "gqa_d128_roles_m128n64", "gqa_d128_roles_m128n64_s3", "gqa_d64_roles_m256n64",
            "gqa_d128_roles_m256n64"} <= set(tags)
    bench = _bench_module()
    try:
        bench.FLAGS(["bench", "--compare_configs=" + ",".join(tags)])
        assert bench.flag_errors() == []
    finally:
        bench.FLAGS.unparse_flags()


def test_bench_default_flags_are_valid():
    bench = _bench_module()
    try:
        bench.FLAGS(["bench"])
        assert bench.flag_errors() == []
        assert bench.FLAGS.time_budget_s is None  # unset: no limit
        bench.FLAGS(["bench", "--time_budget_s=150", "--warmup=0", "--min_iters=7", "--max_iters=7",
                     "--baselines=sglang_backend,flashmla",
                     "--compare_configs=mla_wgmma_m64n64_pipe_rows,mla_wgmma_seesaw_tma"])
        assert bench.flag_errors() == []
    finally:
        bench.FLAGS.unparse_flags()


@pytest.mark.parametrize("args,match", [
    (["--warmup=-1", "--shapes=mla B1 H16 T16 L4k"], "verify_attn bench: --warmup: must be >= 0 (got -1)"),
    (["--baselines=nope", "--shapes=mla B1 H16 T16 L4k"], "verify_attn bench: --baselines: unknown 'nope'"),
    (["--dry_run", "--min_iters=9", "--max_iters=3"], "verify_attn bench: --min_iters: must be <= --max_iters"),
    (["--dry_run", "--compare_configs=bogus"], "verify_attn bench: --compare_configs: unknown 'bogus'; expected "
                                               "some of mla_m32n32_s1, "),
    (["--list", "--warmup=-1"], "verify_attn bench: --warmup: must be >= 0"),
    (["--list", "--shapes=garbage"], "verify_attn bench: no shape matches --shapes='garbage'"),
    (["--shapes=garbage"], "verify_attn bench: no shape matches --shapes='garbage'"),
])
def test_bench_usage_errors_exit_2_naming_the_flag(tmp_path, args, match):
    r = _run_bench(args, tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert match in r.stderr, r.stderr[-2000:]
    assert "needs an NVIDIA GPU" not in r.stderr  # refused before the device is looked at
    assert "USAGE" not in r.stderr and "verify_attn benchmark" not in r.stderr  # no full usage text
    assert r.stdout == ""
