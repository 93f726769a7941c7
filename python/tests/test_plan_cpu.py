"""TreeAttentionPlan's host side without a GPU (a fake extension, CPU tensors):
run() refuses planned tensors whose storage or layout changed, out/lse/info are
read-only, run() launches under the plan's device, debug mode checks after
run() (not during capture), return_lse is a bool, and info has plan_info's keys.
"""

import pytest
import torch

import verify_attn
from verify_attn import attention, errors, masks


class _FakeC:
    DTYPE_FP16, DTYPE_BF16, MASK_TREE, MASK_CAUSAL, KV_FLAT, KV_PAGED = 0, 1, 0, 1, 0, 1

    class Params:
        pass

    def __init__(self, log):
        self.log = log

    def workspace_size(self, p):
        return 0

    def query_config(self, p):
        return {"name": "fake", "tile_m": 64, "tile_n": 64, "num_warps": 4, "num_stages": 2,
                "num_splits": 1, "smem_bytes": 0, "sm_arch": 90}

    def attention(self, p):
        self.log.append(("launch", p.stream))


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


@pytest.fixture
def env(monkeypatch):
    """The fake extension; returns the event log (device guard, launches, checks)."""
    log = []
    fake = _FakeC(log)
    monkeypatch.setattr(attention, "_load_C", lambda: fake)
    monkeypatch.setattr(attention, "_check_devices", lambda *a: None)
    monkeypatch.setattr(attention, "_is_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda d: _Device(log, d))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: _Stream())
    monkeypatch.setattr(errors, "error_word_ptr", lambda d: 0x7F00_0000_1000)
    monkeypatch.setattr(errors, "check_errors", lambda d=None: log.append(("check", d)))
    verify_attn.set_debug(False)
    yield log
    verify_attn.set_debug(False)


def _paged(**kw):
    qo = torch.tensor([0, 2, 6], dtype=torch.int32)
    parents = torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32)
    t = dict(q=torch.randn(6, 4, 64).to(torch.bfloat16),
             k_cache=torch.randn(6, 4, 2, 64).to(torch.bfloat16),
             v_cache=torch.randn(6, 4, 2, 64).to(torch.bfloat16),
             qo_indptr=qo, kv_indptr=torch.tensor([0, 2, 5], dtype=torch.int32),
             kv_indices=torch.tensor([4, 0, 2, 5, 1], dtype=torch.int32),
             kv_len=torch.tensor([5, 9], dtype=torch.int32),
             tree_mask=masks.from_parents(parents, qo))
    args = dict(tree_mask=t["tree_mask"], max_q_len=4, max_kv_len=9)
    args.update(kw)
    return t, args


def _plan(**kw):
    t, args = _paged(**kw)
    p = verify_attn.TreeAttentionPlan(t["q"], t["k_cache"], t["v_cache"], t["qo_indptr"], t["kv_indptr"],
                                      t["kv_indices"], t["kv_len"], **args)
    return p, t


def _flat_plan(**kw):
    qo = torch.tensor([0, 2, 6], dtype=torch.int32)
    parents = torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32)
    t = dict(q=torch.randn(6, 4, 64).to(torch.bfloat16), k=torch.randn(14, 2, 64).to(torch.bfloat16),
             v=torch.randn(14, 2, 64).to(torch.bfloat16), qo_indptr=qo,
             kv_indptr=torch.tensor([0, 5, 14], dtype=torch.int32), tree_mask=masks.from_parents(parents, qo))
    p = verify_attn.TreeAttentionPlan(t["q"], t["k"], t["v"], t["qo_indptr"], t["kv_indptr"],
                                      tree_mask=t["tree_mask"], max_q_len=4, max_kv_len=9, **kw)
    return p, t


def test_run_launches_and_returns_the_planned_buffers(env):
    p, _ = _plan(return_lse=True)
    out, lse = p.run()
    assert out is p.out and lse is p.lse
    assert [e[0] for e in env if e[0] == "launch"] == ["launch"]


@pytest.mark.parametrize("name", ["q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_len",
                                  "tree_mask"])
@pytest.mark.parametrize("how", ["resize_", "set_", "data"])
def test_run_refuses_a_planned_tensor_moved_or_resized(env, name, how):
    p, t = _plan()
    x = t[name]
    if how == "resize_":
        x.resize_((x.shape[0] * 4,) + tuple(x.shape[1:]))  # grows: new storage, new shape
    elif how == "set_":
        x.set_(x.clone())  # same shape, another storage (the planned one may be freed)
    else:
        x.data = x.clone()
    before = len(env)
    with pytest.raises(ValueError, match=rf"^{name}: storage or shape changed since the plan"):
        p.run()
    assert len(env) == before  # nothing launched


def test_run_refuses_a_flat_k_or_an_internal_buffer_changed(env):
    p, t = _flat_plan(return_lse=True)
    t["k"].resize_(20, 2, 64)
    with pytest.raises(ValueError, match=r"^k: storage or shape changed since the plan"):
        p.run()
    p, t = _flat_plan(return_lse=True)
    p.lse.resize_(0)
    with pytest.raises(ValueError, match=r"^lse: storage or shape changed"):
        p.run()
    p, t = _flat_plan()
    p.out.set_(torch.empty(6, 4, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"^out: storage or shape changed"):
        p.run()


def test_in_place_content_updates_are_fine(env):
    p, t = _plan()
    t["q"].copy_(torch.randn(6, 4, 64))
    t["qo_indptr"].copy_(torch.tensor([0, 1, 3], dtype=torch.int32))
    t["kv_len"].fill_(3)
    t["k_cache"].resize_(6, 4, 2, 64)  # a resize_ to the same shape keeps the storage
    p.run()
    p.run()
    assert len([e for e in env if e[0] == "launch"]) == 2


@pytest.mark.parametrize("attr", ["out", "lse", "info"])
def test_out_lse_info_are_read_only(env, attr):
    p, _ = _plan(return_lse=True)
    with pytest.raises(AttributeError):
        setattr(p, attr, None)
    with pytest.raises(AttributeError):
        delattr(p, attr)
    out, lse = p.run()
    assert out is p.out and lse is p.lse


def test_info_is_a_copy(env):
    p, _ = _plan()
    p.info["name"] = "changed"
    assert p.info["name"] == "fake"


def test_run_launches_under_the_plan_device(env):
    p, _ = _plan()
    del env[:]
    p.run()
    assert env == [("enter", p.out.device), ("launch", 0x5), ("exit", p.out.device)]


def test_debug_mode_checks_after_run(env):
    p, _ = _plan()
    p.run()
    assert [e for e in env if e[0] == "check"] == []
    verify_attn.set_debug(True)
    del env[:]
    p.run()
    p.run()
    assert [e[0] for e in env if e[0] != "enter" and e[0] != "exit"] == ["launch", "check", "launch", "check"]


def test_debug_mode_skips_the_check_while_capturing(env, monkeypatch):
    p, _ = _plan()
    verify_attn.set_debug(True)
    monkeypatch.setattr(attention, "_is_capturing", lambda: True)
    del env[:]
    p.run()
    assert [e[0] for e in env if e[0] in ("launch", "check")] == ["launch"]


@pytest.mark.parametrize("bad", ["no", 1, None, 0.0])
def test_return_lse_must_be_a_bool(env, bad):
    with pytest.raises(TypeError, match=r"^return_lse: expected a bool"):
        _plan(return_lse=bad)
    t, args = _paged(return_lse=bad)
    with pytest.raises(TypeError, match=r"^return_lse: expected a bool"):
        verify_attn.plan_info(t["q"], t["k_cache"], t["v_cache"], t["qo_indptr"], t["kv_indptr"],
                              t["kv_indices"], t["kv_len"], **args)


@pytest.mark.parametrize("layout", ["paged", "flat"])
def test_info_has_the_keys_of_plan_info(env, layout):
    if layout == "paged":
        p, _ = _plan()
        t, args = _paged()
        ref = verify_attn.plan_info(t["q"], t["k_cache"], t["v_cache"], t["qo_indptr"], t["kv_indptr"],
                                    t["kv_indices"], t["kv_len"], **args)
    else:
        p, t = _flat_plan()
        ref = verify_attn.plan_info(t["q"], t["k"], t["v"], t["qo_indptr"], t["kv_indptr"],
                                    tree_mask=t["tree_mask"], max_q_len=4, max_kv_len=9)
    assert p.info == ref
    assert p.info["kv_layout"] == layout and p.info["v_is_k_prefix"] == 0
    assert (p.info["max_q_len"], p.info["max_kv_len"], p.info["workspace_bytes"]) == (4, 9, 0)


@pytest.mark.parametrize("missing", ["max_q_len", "max_kv_len"])
def test_a_missing_bound_is_named(env, missing):
    t, args = _paged(**{missing: None})
    with pytest.raises(ValueError, match=rf"^{missing}: a plan needs host upper bounds"):
        verify_attn.TreeAttentionPlan(t["q"], t["k_cache"], t["v_cache"], t["qo_indptr"], t["kv_indptr"],
                                      t["kv_indices"], t["kv_len"], **args)
