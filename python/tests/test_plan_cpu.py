"""TreeAttentionPlan's host side without a GPU (a fake extension, CPU tensors
standing in for CUDA ones): one C plan per layout however many runs, a new
layout planned once, the run's pointers and stream reach the launch, the plan's
tuning reaches va_plan_create, run() launches under the plan's device, debug
mode checks after run() (not during capture), the batch arguments are checked
at construction (naming the argument), and info() has plan_info's keys.
"""

import pytest
import torch

import verify_attn
from verify_attn import attention, errors, masks
from verify_attn import plan as plan_mod


class _FakeC:
    DTYPE_FP16, DTYPE_BF16, MASK_TREE, MASK_CAUSAL, KV_FLAT, KV_PAGED = 0, 1, 0, 1, 0, 1
    KV_DTYPE_AS_Q, KV_DTYPE_FP8_E4M3 = 0, 1

    class Params:
        def set(self, **fields):  # the binding's Params.set
            self.__dict__.update(fields)

    def __init__(self, log):
        self.log = log
        fake = self

        class Plan:
            def __init__(self, p, *options):
                self.p = p
                fake.log.append(("plan", options))
                fake.params = dict(p.__dict__)  # the last plan's va_params

            def info(self):
                return {"name": "fake", "tile_m": 64, "tile_n": 64, "num_warps": 4, "num_stages": 2,
                        "num_splits": 1, "smem_bytes": 0, "sm_arch": 90, "workspace_bytes": 0,
                        "k_tma": False, "q_tma": False, "o_tma": False, "grid_rows_fastest": False}

            def run(self, q, k, v, out, lse, ws, ws_bytes, stream, *scales):
                fake.log.append(("launch", stream, (q, k, v, out, lse), scales))

        self.Plan = Plan


@pytest.fixture
def env(monkeypatch):
    """The fake extension; returns the event log (plans, device guard, launches, checks)."""
    log = []
    fake = _FakeC(log)
    monkeypatch.setattr(attention, "_load_C", lambda: fake)
    monkeypatch.setattr(attention, "_check_devices", lambda *a: None)
    monkeypatch.setattr(attention, "_is_capturing", lambda: False)
    monkeypatch.setattr(plan_mod, "_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda d: _Device(log, d))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(plan_mod, "_current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: _Stream())
    monkeypatch.setattr(errors, "error_word_ptr", lambda d: 0x7F00_0000_1000)
    monkeypatch.setattr(errors, "check_errors", lambda d=None: log.append(("check", d)))
    # CPU tensors stand in for CUDA ones: the plan's own device checks see "cpu".
    monkeypatch.setattr(plan_mod.TreeAttentionPlan, "_check_batch_device", lambda self, t: None)
    verify_attn.set_debug(False)
    yield log
    verify_attn.set_debug(False)


class _Stream:
    cuda_stream = 0x5


class _Device:
    def __init__(self, log, d):
        self.log, self.d = log, d

    def __enter__(self):
        self.log.append(("enter", self.d))

    def __exit__(self, *a):
        self.log.append(("exit", self.d))
        return False


def _batch():
    qo = torch.tensor([0, 2, 6], dtype=torch.int32)
    parents = torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32)
    return dict(qo_indptr=qo, kv_indptr=torch.tensor([0, 2, 5], dtype=torch.int32),
                kv_indices=torch.tensor([4, 0, 2, 5, 1], dtype=torch.int32),
                kv_len=torch.tensor([5, 9], dtype=torch.int32), tree_mask=masks.from_parents(parents, qo))


def _layer(seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(q=torch.randn(6, 4, 64, generator=g).to(torch.bfloat16),
                k_cache=torch.randn(6, 4, 2, 64, generator=g).to(torch.bfloat16),
                v_cache=torch.randn(6, 4, 2, 64, generator=g).to(torch.bfloat16))


def _plan(**kw):
    b = _batch()
    args = dict(num_qo_heads=4, num_kv_heads=2, head_dim_qk=64, tree_mask=b["tree_mask"], max_q_len=4,
                max_kv_len=9)
    args.update(kw)
    return verify_attn.TreeAttentionPlan(b["qo_indptr"], b["kv_indptr"], b["kv_indices"], b["kv_len"], **args)


def _launches(log):
    return [e for e in log if e[0] == "launch"]


def test_one_c_plan_for_many_layers(env):
    p = _plan()
    for layer in range(5):
        t = _layer(layer)
        out = p.run(t["q"], t["k_cache"], t["v_cache"])
        assert out.shape == (6, 4, 64) and out.dtype == torch.bfloat16
        q, k, v, o, lse = _launches(env)[-1][2]
        assert (q, k, v, o, lse) == (t["q"].data_ptr(), t["k_cache"].data_ptr(), t["v_cache"].data_ptr(),
                                     out.data_ptr(), 0)
    assert p.plans_made == 1 and len(_launches(env)) == 5
    assert [e for e in env if e[0] == "plan"] == [("plan", plan_mod.DEFAULT_OPTIONS)]


def test_fp8_plan_takes_its_scales_and_each_runs_own(env):
    """An fp8 plan: its scales and kv_dtype reach va_params; a run's own scales reach
    va_plan_run (0.0 keeps the plan's); a plan for a bf16 cache takes none; bad ones name
    the argument."""
    p = _plan(kv_dtype=torch.float8_e4m3fn, k_scale=0.5, v_scale=2.0)
    t = _layer()
    k8, v8 = t["k_cache"].to(torch.float8_e4m3fn), t["v_cache"].to(torch.float8_e4m3fn)
    p.run(t["q"], k8, v8)
    params = attention._load_C().params
    assert (params["kv_dtype"], params["k_scale"], params["v_scale"]) == (1, 0.5, 2.0)
    p.run(t["q"], k8, v8, k_scale=0.25)
    p.run(t["q"], k8, v8, k_scale=0.25, v_scale=3)
    assert [e[3] for e in _launches(env)] == [(), (0.25, 0.0), (0.25, 3.0)]
    assert p.plans_made == 1
    with pytest.raises(ValueError, match=r"^k_scale: must be finite and > 0"):
        p.run(t["q"], k8, v8, k_scale=float("inf"))
    with pytest.raises(TypeError, match=r"^v_scale: expected a Python float"):
        p.run(t["q"], k8, v8, v_scale="2")
    with pytest.raises(TypeError, match=r"^k_cache: dtype torch.bfloat16 differs from the plan's kv_dtype"):
        p.run(t["q"], t["k_cache"], t["v_cache"])
    with pytest.raises(ValueError, match=r"^k_scale: only a plan for an fp8 cache"):
        _plan().run(t["q"], t["k_cache"], t["v_cache"], k_scale=0.5)
    with pytest.raises(TypeError, match=r"^kv_dtype: None \(= dtype\)"):
        _plan(kv_dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match=r"^k_scale: only an fp8 cache"):
        _plan(k_scale=0.5)


def test_fp8_mla_plan_v_scale_is_k_scale(env):
    """MLA's one cache: k_scale scales the values too, so a v_scale (the plan's or a
    run's) other than k_scale is refused naming v_scale; unset or equal passes."""
    mla = dict(num_qo_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_vo=512, kv_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"^v_scale: an MLA cache holds K and V in one tensor"):
        _plan(k_scale=0.5, v_scale=0.25, **mla)
    _plan(k_scale=0.5, v_scale=0.5, **mla)
    p = _plan(k_scale=0.5, **mla)
    with pytest.raises(ValueError, match=r"^v_scale: an MLA cache holds K and V in one tensor"):
        p._run_scales(None, 0.25)
    with pytest.raises(ValueError, match=r"^v_scale: an MLA cache holds K and V in one tensor"):
        p._run_scales(0.25, 0.5)
    assert p._run_scales(0.25, 0.25) == (0.25, 0.25) and p._run_scales(None, 0.5) == (0.0, 0.5)


def test_a_new_layout_is_planned_once(env):
    p = _plan()
    t = _layer()
    p.run(t["q"], t["k_cache"], t["v_cache"])
    wide = torch.zeros(6, 4, 128, dtype=torch.bfloat16)[..., :64]  # another q stride
    wide.copy_(t["q"])
    for _ in range(3):
        p.run(wide, t["k_cache"], t["v_cache"])
    out, lse = p.run(t["q"], t["k_cache"], t["v_cache"], return_lse=True)  # with an lse: a layout too
    p.run(t["q"], t["k_cache"], t["v_cache"], out=out, lse=lse)
    assert lse.shape == (6, 4) and lse.dtype == torch.float32
    # q / caches, the wider q, an allocated lse, and a given out (its strides are part of a layout)
    assert p.plans_made == 4 and len(_launches(env)) == 6


def test_the_tuning_reaches_the_plan(env):
    p = _plan(tuning=verify_attn.Tuning(config="gqa_d64_m64n64_s2", grid_order="requests", q_tma=False,
                                        max_smem_bytes=101376))
    t = _layer()
    p.run(t["q"], t["k_cache"], t["v_cache"])
    assert [e for e in env if e[0] == "plan"] == [("plan", ("gqa_d64_m64n64_s2", 2, 0, 2, 0, 101376, 0, 0))]


def test_run_launches_under_the_plan_device(env, monkeypatch):
    p = _plan()
    t = _layer()
    p.run(t["q"], t["k_cache"], t["v_cache"])  # the layout's plan
    monkeypatch.setattr(plan_mod, "_current_device", lambda: 1)  # another current device
    del env[:]
    p.run(t["q"], t["k_cache"], t["v_cache"])
    assert [e[0] for e in env] == ["enter", "launch", "exit"] and env[1][1] == 0x5


def test_debug_mode_checks_after_run(env):
    p = _plan()
    t = _layer()
    p.run(t["q"], t["k_cache"], t["v_cache"])
    assert [e for e in env if e[0] == "check"] == []
    verify_attn.set_debug(True)
    del env[:]
    p.run(t["q"], t["k_cache"], t["v_cache"])
    p.run(t["q"], t["k_cache"], t["v_cache"])
    assert [e[0] for e in env if e[0] in ("launch", "check")] == ["launch", "check", "launch", "check"]


def test_debug_mode_skips_the_check_while_capturing(env, monkeypatch):
    p = _plan()
    t = _layer()
    verify_attn.set_debug(True)
    monkeypatch.setattr(attention, "_is_capturing", lambda: True)
    del env[:]
    p.run(t["q"], t["k_cache"], t["v_cache"])
    assert [e[0] for e in env if e[0] in ("launch", "check")] == ["launch"]


@pytest.mark.parametrize("missing", ["max_q_len", "max_kv_len"])
def test_a_missing_bound_is_named(env, missing):
    with pytest.raises(ValueError, match=rf"^{missing}: a plan needs host upper bounds"):
        _plan(**{missing: None})


@pytest.mark.parametrize("kw,err,match", [
    (dict(tree_mask=None), ValueError, r"^tree_mask: pass exactly one of tree_mask and causal=True \(neither"),
    (dict(causal=True), ValueError, r"^tree_mask: pass exactly one of tree_mask and causal=True \(both"),
    (dict(causal=1), TypeError, r"^causal: expected a bool"),
    (dict(max_q_len=0), ValueError, r"^max_q_len: must be in \[1, 1024\]"),
    (dict(max_q_len=1025), ValueError, r"^max_q_len: must be in \[1, 1024\]"),
    (dict(max_kv_len=-1), ValueError, r"^max_kv_len: must be in \[0, 2\^31-1\]"),
    (dict(num_kv_heads=3), ValueError, r"^num_kv_heads: 3 must divide num_qo_heads 4"),
    (dict(num_qo_heads=0), ValueError, r"^num_qo_heads: must be >= 1"),
    (dict(dtype=torch.float32), TypeError, r"^dtype: torch.float16 or torch.bfloat16"),
    (dict(tuning="fast"), TypeError, r"^tuning: expected a verify_attn.Tuning"),
    (dict(num_splits=-1), ValueError, r"^num_splits: must be in \[0, 65535\]"),
    (dict(num_splits=10**9), ValueError, r"^num_splits: must be in \[0, 65535\]"),
    (dict(head_dim_vo=0), ValueError, r"^head_dim_vo: must be >= 1"),
    (dict(tree_mask=[[1]] * 6), TypeError, r"^tree_mask: expected a torch.Tensor, got list"),
    (dict(max_q_len=100), ValueError, r"^tree_mask: expected \[total_q, W\] with W \* 32 >= max_q_len = 100"),
])
def test_plan_arguments_are_named(env, kw, err, match):
    with pytest.raises(err, match=match):
        _plan(**kw)


def test_a_2d_index_tensor_is_named(env):
    b = _batch()
    with pytest.raises(ValueError, match=r"^qo_indptr: expected a 1-D tensor, got shape \(3, 1\)"):
        verify_attn.TreeAttentionPlan(b["qo_indptr"][:, None], b["kv_indptr"], b["kv_indices"], b["kv_len"],
                                      num_qo_heads=4, num_kv_heads=2, head_dim_qk=64, tree_mask=b["tree_mask"],
                                      max_q_len=4, max_kv_len=9)


@pytest.mark.parametrize("kw,err,match", [
    (dict(grid_order="cols"), ValueError, r"^tuning.grid_order: one of"),
    (dict(grid_order=["rows"]), TypeError, r"^tuning.grid_order: expected a str, got list"),
    (dict(max_smem_bytes=-1), ValueError, r"^tuning.max_smem_bytes"),
    (dict(early_release="yes"), TypeError, r"^tuning.early_release: expected a bool"),
    (dict(config="mla_nope"), ValueError, r"^tuning.config: unknown configuration tag 'mla_nope' \(name one of: mla_m32n32_s1"),
    (dict(config=3), TypeError, r"^tuning.config: expected a str"),
])
def test_tuning_is_checked_at_construction(kw, err, match):
    with pytest.raises(err, match=match):
        verify_attn.Tuning(**kw)


def test_run_arguments_that_are_not_tensors_are_named(env):
    p = _plan()
    t = _layer()
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor, got list"):
        p.run([1, 2], t["k_cache"], t["v_cache"])
    with pytest.raises(TypeError, match=r"^k_cache: expected a torch.Tensor, got NoneType"):
        p.run(t["q"], None, t["v_cache"])
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor, got list"):
        p.info([1], t["k_cache"], t["v_cache"])
    with pytest.raises(TypeError, match=r"^return_lse: expected a bool, got int 1"):
        p.run(t["q"], t["k_cache"], t["v_cache"], return_lse=1)


def test_index_dtypes_and_the_paged_pair(env):
    b = _batch()
    args = dict(num_qo_heads=4, num_kv_heads=2, head_dim_qk=64, tree_mask=b["tree_mask"], max_q_len=4,
                max_kv_len=9)
    with pytest.raises(TypeError, match=r"^kv_len: expected dtype torch.int32"):
        verify_attn.TreeAttentionPlan(b["qo_indptr"], b["kv_indptr"], b["kv_indices"], b["kv_len"].long(), **args)
    with pytest.raises(ValueError, match=r"^kv_indices: required for the paged layout"):
        verify_attn.TreeAttentionPlan(b["qo_indptr"], b["kv_indptr"], None, b["kv_len"], **args)
    with pytest.raises(ValueError, match=r"^kv_len: required for the paged layout"):
        verify_attn.TreeAttentionPlan(b["qo_indptr"], b["kv_indptr"], b["kv_indices"], None, **args)


def test_a_run_that_does_not_fit_the_plan_is_named(env):
    p = _plan()
    t = _layer()
    with pytest.raises(TypeError, match=r"^q: dtype torch.float16 differs from the plan's torch.bfloat16"):
        p.run(t["q"].half(), t["k_cache"], t["v_cache"])
    with pytest.raises(ValueError, match=r"^q: expected shape \[total_q, 4, 64\]"):
        p.run(t["q"][:, :2], t["k_cache"], t["v_cache"])
    with pytest.raises(ValueError, match=r"^v_cache: required \(the plan is MHA/GQA"):
        p.run(t["q"], t["k_cache"], None)
    assert _launches(env) == [] and p.plans_made == 0


def test_info_has_the_keys_of_plan_info(env):
    p = _plan()
    t = _layer()
    b = _batch()
    ref = verify_attn.plan_info(t["q"], t["k_cache"], t["v_cache"], b["qo_indptr"], b["kv_indptr"],
                                b["kv_indices"], b["kv_len"], tree_mask=b["tree_mask"], max_q_len=4, max_kv_len=9)
    info = p.info(t["q"], t["k_cache"], t["v_cache"])
    assert info == ref
    assert info["kv_layout"] == "paged" and info["v_is_k_prefix"] == 0
    assert (info["max_q_len"], info["max_kv_len"], info["workspace_bytes"]) == (4, 9, 0)
    info["name"] = "changed"
    assert p.info(t["q"], t["k_cache"], t["v_cache"])["name"] == "fake"  # a copy
    assert _launches(env) == []
