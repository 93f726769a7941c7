"""CPU tests of the SGLang plugin (real SGLang 0.5.23 code, no GPU).

Run in the venv made by ``tools/fetch_sglang.sh venv`` (sglang installed with
``--no-deps`` plus the few packages its imports need), with
``integration/sglang/tests/stubs/{common,cpu}`` on ``sys.path`` (conftest.py
does that). ``VERIFY_ATTN_WHEEL`` (optional): a built verify_attn wheel whose
metadata must declare the entry point.
"""

import importlib.metadata
import os
import random
import sys
import zipfile

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # integration/sglang: the plugin package
sys.path.insert(0, HERE)  # kit_compat (the SGLang test-kit fix the GPU test uses)

from verify_attn_sglang import metadata as md  # noqa: E402

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_LINE = "verify_attn = verify_attn_sglang:register"


def _sglang_or_skip():
    try:
        import sglang  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"sglang not importable here ({type(e).__name__}: {e}); run through tools/fetch_sglang.sh")


# ----------------------------------------------------------------------------- entry point


def test_entry_points_file_declares_plugin():
    path = os.path.join(os.path.dirname(HERE), "entry_points.txt")
    with open(path) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    assert lines[0] == f"[{ENTRY_POINT_GROUP}]"
    assert ENTRY_POINT_LINE in lines


def test_wheel_metadata_declares_plugin():
    wheel = os.environ.get("VERIFY_ATTN_WHEEL")
    if not wheel:
        pytest.skip("VERIFY_ATTN_WHEEL not set")
    with zipfile.ZipFile(wheel) as z:
        eps = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        assert eps, "the wheel has no entry_points.txt"
        text = z.read(eps[0]).decode()
        names = z.namelist()
    assert f"[{ENTRY_POINT_GROUP}]" in text and ENTRY_POINT_LINE in text, text
    assert "verify_attn_sglang/__init__.py" in names and "verify_attn_sglang/backend.py" in names


def test_installed_distribution_entry_point():
    """When verify_attn is installed (a venv with the wheel), importlib.metadata finds the plugin."""
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "verify_attn"]
    if not eps:
        pytest.skip("no installed distribution declares the plugin here (source checkout)")
    assert eps[0].value == "verify_attn_sglang:register"


# ----------------------------------------------------------------------------- registration


def test_register_adds_backend_and_cli_choice():
    _sglang_or_skip()
    import verify_attn_sglang
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    verify_attn_sglang.register()
    verify_attn_sglang.register()  # idempotent
    assert ATTENTION_BACKENDS["verify_attn"] is verify_attn_sglang.create_backend
    assert ATTENTION_BACKEND_CHOICES.count("verify_attn") == 1


def test_sglang_load_plugins_runs_entry_point(monkeypatch):
    """SGLang's own loader (sglang.srt.plugins.load_plugins_by_group) finds and runs the entry point."""
    _sglang_or_skip()
    import sglang.srt.plugins as plugins
    import verify_attn_sglang

    class _EP:
        name = "verify_attn"
        value = "verify_attn_sglang:register"
        dist = None

        def load(self):
            return verify_attn_sglang.register

    real = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "verify_attn"]
    fake = real or [_EP()]
    monkeypatch.setattr(plugins, "entry_points", lambda group: fake if group == ENTRY_POINT_GROUP else [])
    monkeypatch.setenv("SGLANG_PLUGINS", "verify_attn")
    found = plugins.load_plugins_by_group(ENTRY_POINT_GROUP)
    assert "verify_attn" in found
    found["verify_attn"][0]()
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    assert "verify_attn" in ATTENTION_BACKENDS


def test_cli_parses_verify_attn():
    _sglang_or_skip()
    import verify_attn_sglang

    verify_attn_sglang.register()
    from sglang.srt.arg_groups.fields.exec_ import ATTENTION_BACKEND_CHOICES as field_choices

    assert "verify_attn" in field_choices  # the list argparse reads is the extended one
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(
        ["--model-path", "dummy", "--attention-backend", "verify_attn",
         "--prefill-attention-backend", "triton", "--decode-attention-backend", "verify_attn"]
    )
    assert ns.attention_backend == "verify_attn"
    assert ns.decode_attention_backend == "verify_attn"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "dummy", "--attention-backend", "no_such_backend"])


def test_backend_module_imports_with_sglang():
    _sglang_or_skip()
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from verify_attn_sglang.backend import VerifyAttnBackend

    assert issubclass(VerifyAttnBackend, TritonAttnBackend)
    for name in ("init_forward_metadata", "init_forward_metadata_out_graph", "init_cuda_graph_state",
                 "forward_extend"):
        assert getattr(VerifyAttnBackend, name) is not getattr(TritonAttnBackend, name), name
    # everything else is inherited, not copied
    for name in ("forward_decode", "get_cuda_graph_seq_len_fill_value", "_fill_kv_indptr_and_indices"):
        assert getattr(VerifyAttnBackend, name) is getattr(TritonAttnBackend, name), name


# ----------------------------------------------------------------------------- metadata on CPU tensors


def _ancestors(parents):
    n = len(parents)
    vis = [[False] * n for _ in range(n)]
    for t in range(n):
        c = t
        while c >= 0:
            vis[t][c] = True
            c = parents[c]
    return vis


def _bits_to_rows(bits, n):
    out = []
    for row in bits.tolist():
        out.append([bool((row[c // 32] >> (c % 32)) & 1) for c in range(n)])
    return out


def _full_mask(prefix_lens, trees):
    """SGLang's FULL verify mask of requests with these prefix lengths and draft
    trees (parent lists): per request ``n x (prefix + n)`` bools, the prefix
    all visible, the drafts by ancestry, concatenated."""
    parts = []
    for p, parents in zip(prefix_lens, trees):
        n = len(parents)
        m = torch.ones(n, p + n, dtype=torch.bool)
        m[:, p:] = torch.tensor(_ancestors(parents), dtype=torch.bool)
        parts.append(m.reshape(-1))
    return torch.cat(parts)


HAND_TREES = {
    "chain4": [-1, 0, 1, 2],
    "kit_tree3": [-1, 0, 0],  # SGLang's kit tree: root + two branches
    "eagle7": [-1, 0, 0, 1, 1, 2, 2],
    "star5": [-1, 0, 0, 0, 0],
}


@pytest.mark.parametrize("name", sorted(HAND_TREES))
def test_qlen_only_to_bits_hand_trees(name):
    parents = HAND_TREES[name]
    n = len(parents)
    bs = 3
    vis = torch.tensor(_ancestors(parents), dtype=torch.bool)
    qlen = vis.repeat(bs, 1, 1).reshape(-1)  # SGLang QLEN_ONLY: bs * n * n
    padded = torch.cat([qlen, torch.ones(17, dtype=torch.bool)])  # a larger (preallocated) buffer
    bits = md.qlen_only_to_bits(padded, bs, n)
    assert bits.dtype == torch.int32 and tuple(bits.shape) == (bs * n, 1)
    assert _bits_to_rows(bits, n) == _ancestors(parents) * bs


def test_full_mask_to_bits_matches_qlen_only():
    rng = random.Random(5)
    n = 40  # two words per row
    seq_lens = torch.tensor([3, 17, 1, 64], dtype=torch.int32)
    trees = [[-1] + [rng.randrange(i) for i in range(1, n)] for _ in seq_lens.tolist()]
    full = _full_mask(seq_lens.tolist(), trees)
    qlen = torch.cat([torch.tensor(_ancestors(t), dtype=torch.bool).reshape(-1) for t in trees])
    b_full = md.full_mask_to_bits(full, seq_lens, n)
    b_qlen = md.qlen_only_to_bits(qlen, 4, n)
    assert tuple(b_full.shape) == (4 * n, 2)
    assert torch.equal(b_full, b_qlen)
    expect = [row for t in trees for row in _ancestors(t)]
    assert _bits_to_rows(b_full, n) == expect


def test_bits_agree_with_verify_attn_masks():
    """Same bits as verify_attn.masks (the library's own converters, the layouts' one
    home) on a random batch, QLEN_ONLY and FULL."""
    pytest.importorskip("verify_attn.masks")
    from verify_attn import masks, testing

    rng = random.Random(11)
    n, bs = 16, 5
    parents = []
    for _ in range(bs):
        parents += testing.random_parents("ddtree", n, rng=rng)
    qo = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
    ref = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo)
    qlen = torch.cat([torch.tensor(_ancestors(parents[i * n:(i + 1) * n])).reshape(-1) for i in range(bs)])
    assert torch.equal(md.qlen_only_to_bits(qlen, bs, n), ref)
    assert torch.equal(masks.from_sglang_qlen_only(qlen, qo), ref)
    seq_lens = torch.tensor([rng.randrange(0, 40) for _ in range(bs)], dtype=torch.int32)
    full = _full_mask(seq_lens.tolist(), [parents[i * n:(i + 1) * n] for i in range(bs)])
    assert torch.equal(md.full_mask_to_bits(full, seq_lens, n), ref)
    assert torch.equal(masks.from_sglang_full_mask(full, qo, seq_lens), ref)


def test_layout_detection():
    bs, n = 4, 8
    own = torch.zeros(16 * n * n, dtype=torch.bool)
    assert md.is_qlen_only_layout(own, bs, n, own)  # our buffer, whatever its size
    assert md.is_qlen_only_layout(own[: bs * n * n], bs, n, own)
    foreign_qlen = torch.zeros(bs * n * n, dtype=torch.bool)
    assert md.is_qlen_only_layout(foreign_qlen, bs, n, own)
    foreign_full = torch.zeros(bs * n * (5 + n), dtype=torch.bool)
    assert not md.is_qlen_only_layout(foreign_full, bs, n, own)


def test_indptr_and_lengths():
    seq_lens = torch.tensor([5, 0, 9], dtype=torch.int32)
    n = 4
    assert md.uniform_qo_indptr(3, n).tolist() == [0, 4, 8, 12]
    assert md.verify_kv_indptr(seq_lens, n).tolist() == [0, 9, 13, 26]
    assert md.verify_kv_len(seq_lens, n).tolist() == [9, 4, 13]
    buf = torch.full((8,), -7, dtype=torch.int32)
    v = md.verify_kv_indptr(seq_lens, n, out=buf)
    assert v.data_ptr() == buf.data_ptr() and buf[:4].tolist() == [0, 9, 13, 26] and buf[4] == -7
    qbuf = torch.zeros(8, dtype=torch.int32)
    md.uniform_qo_indptr(3, n, out=qbuf)
    assert qbuf[:4].tolist() == [0, 4, 8, 12]


def test_build_verify_kv_hand_layout():
    """Scattered slots, a request pool row order != batch order, drafts at non-monotonic slots."""
    n = 3
    width = 12
    req_to_token = torch.full((4, width), -1, dtype=torch.int32)
    req_to_token[2, :5] = torch.tensor([40, 41, 7, 8, 100])  # request 0 of the batch is pool row 2
    req_to_token[0, :2] = torch.tensor([3, 90])  # request 1 is pool row 0
    req_pool_indices = torch.tensor([2, 0])
    seq_lens = torch.tensor([5, 2], dtype=torch.int32)
    out_cache_loc = torch.tensor([200, 55, 201, 9, 11, 10], dtype=torch.int64)
    kv_indptr, kv_indices, kv_len = md.build_verify_kv(req_to_token, req_pool_indices, seq_lens, out_cache_loc, n)
    assert kv_indptr.tolist() == [0, 8, 13]
    assert kv_len.tolist() == [8, 5]
    assert kv_indices.dtype == torch.int32
    assert kv_indices[:13].tolist() == [40, 41, 7, 8, 100, 200, 55, 201, 3, 90, 9, 11, 10]


def test_build_verify_kv_random_against_loop():
    rng = random.Random(3)
    for _ in range(20):
        bs = rng.randint(1, 6)
        n = rng.randint(1, 20)
        width = 64
        pool = rng.randint(bs, bs + 3)
        req_to_token = torch.randint(0, 10_000, (pool, width), dtype=torch.int32)
        req_pool_indices = torch.tensor(rng.sample(range(pool), bs))
        seq_lens = torch.tensor([rng.randint(0, width - n) for _ in range(bs)], dtype=torch.int32)
        out_cache_loc = torch.randint(0, 10_000, (bs * n,), dtype=torch.int64)
        kv_indptr, kv_indices, kv_len = md.build_verify_kv(
            req_to_token, req_pool_indices, seq_lens, out_cache_loc, n)
        expect = []
        for r in range(bs):
            expect += req_to_token[req_pool_indices[r], : seq_lens[r]].tolist()
            expect += out_cache_loc[r * n:(r + 1) * n].tolist()
        total = int(kv_indptr[-1])
        assert total == len(expect)
        assert kv_indices[:total].tolist() == expect
        assert kv_len.tolist() == (seq_lens + n).tolist()


def test_memory_numbers_in_readme():
    """The README's figures are this arithmetic (max_bs 64, 16 drafts, 128k context)."""
    full = md.full_mask_bytes(64, 16, 131072)
    assert full == 134_234_112  # 128.0 MiB
    assert md.qlen_only_mask_bytes(64, 16) == 16_384
    assert md.compact_mask_bytes(64, 16) == 4_096
    readme = os.path.join(os.path.dirname(HERE), "README.md")
    with open(readme) as f:
        text = f.read()
    assert "134,234,112" in text and "16,384" in text and "4,096" in text


# ----------------------------------------------------------------------------- the backend's own metadata path


def _bare_backend(n, max_bs, req_to_token, max_context_len=64):
    """A VerifyAttnBackend without TritonAttnBackend.__init__ (that one needs a GPU):
    just the attributes the target-verify metadata path reads."""
    from verify_attn_sglang.backend import VerifyAttnBackend

    b = object.__new__(VerifyAttnBackend)
    b.va_enabled = True
    b.num_draft_tokens = n
    b.target_verify_num_tokens_per_req = n
    b.max_context_len = max_context_len
    b.device = "cpu"  # as SGLang sets it (TritonAttnBackend: model_runner.device, a string)
    b.req_to_token = req_to_token
    b._va_graph = None
    b._va_eager = None
    b._va_layer_keys = {}
    b._va_max_bs = max_bs
    b._verify_mask = b._va_make_verify_mask(max_bs)
    return b


def _verify_fb(n, req_pool_indices, seq_lens, out_cache_loc, custom_mask, topk, **extra):
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=len(req_pool_indices),
        spec_info=SimpleNamespace(custom_mask=custom_mask, topk=topk, num_tokens_per_req=n),
        req_pool_indices=req_pool_indices, seq_lens=seq_lens, seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.clone(), out_cache_loc=out_cache_loc, kv_loc_plan=None, **extra)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("layout", ["qlen_own", "qlen_foreign", "full", "chain"])
def test_backend_target_verify_metadata_cpu(graph, layout):
    _sglang_or_skip()
    rng = random.Random(7)
    n, bs, pool, width = 6, 3, 5, 64
    req_to_token = torch.randint(0, 5000, (pool, width), dtype=torch.int32)
    b = _bare_backend(n, pool, req_to_token)
    if graph:
        b._va_alloc_graph(4)
    req_pool_indices = torch.tensor([4, 1, 2])
    seq_lens = torch.tensor([10, 1, 33], dtype=torch.int32)
    out_cache_loc = torch.randint(5000, 6000, (bs * n,), dtype=torch.int64)
    trees = [[-1] + [rng.randrange(i) for i in range(1, n)] for _ in range(bs)]
    anc = [torch.tensor(_ancestors(t), dtype=torch.bool) for t in trees]
    qlen = torch.cat([a.reshape(-1) for a in anc])
    topk = 4
    if layout == "qlen_own":
        b._verify_mask.buffer.fill_(True)
        b._verify_mask.buffer[: qlen.numel()] = qlen
        custom_mask = b._verify_mask.buffer
    elif layout == "qlen_foreign":
        custom_mask = qlen.clone()
    elif layout == "full":
        custom_mask = _full_mask(seq_lens.tolist(), trees)
    else:
        custom_mask, topk = torch.tril(torch.ones(n, n, dtype=torch.bool)).repeat(bs, 1, 1).reshape(-1), 1
    fb = _verify_fb(n, req_pool_indices, seq_lens, out_cache_loc, custom_mask, topk)
    if graph:
        b.init_forward_metadata_out_graph(fb, in_capture=True)
    else:
        b.init_forward_metadata(fb)
    m = b.va_metadata
    assert b.forward_metadata is m
    assert m.bs == bs and m.n == n
    assert m.qo_indptr.tolist() == [0, 6, 12, 18]
    assert m.kv_len.tolist() == [16, 7, 39]
    assert m.kv_indptr.tolist() == [0, 16, 23, 62]
    rows = []
    for r in range(bs):
        rows += req_to_token[req_pool_indices[r], : seq_lens[r]].tolist() + out_cache_loc[r * n:(r + 1) * n].tolist()
    assert m.kv_indices.dtype == torch.int32 and m.kv_indices[:62].tolist() == rows
    # Eager: the longest request's 33 + n rows rounded up (256 at least), at most max_context_len + n.
    assert m.max_kv_len == 64 + n
    if layout == "chain":
        assert m.causal and m.tree_mask is None
    else:
        assert not m.causal
        assert _bits_to_rows(m.tree_mask, n) == [row for t in trees for row in _ancestors(t)]
        if graph:
            assert m.tree_mask.data_ptr() == b._va_graph["tree_mask"].data_ptr()
    # CUDA-graph buffers are written in place, never reallocated; eager batches
    # write into grow-only buffers of their own.
    bufs = b._va_graph if graph else b._va_eager
    assert m.kv_indices.data_ptr() == bufs["kv_indices"].data_ptr()
    assert m.kv_indptr.data_ptr() == bufs["kv_indptr"].data_ptr()
    assert graph == (b._va_eager is None)


def test_backend_plans_once_per_forward_batch(monkeypatch):
    """forward_extend of several layers after one init_forward_metadata makes one
    TreeAttentionPlan and runs it per layer (the layers' q and caches); the next
    batch of the same shape reuses it, one of another size makes its own; a layer
    of other heads or scale gets its own."""
    _sglang_or_skip()
    from types import SimpleNamespace

    from verify_attn_sglang import backend as be

    made, runs = [], []

    class Plan:
        def __init__(self, *args, **kw):
            made.append(kw)

        def run(self, q, k_cache, v_cache=None, *, out=None, **kw):
            runs.append((len(made), q.shape, k_cache.data_ptr(), v_cache, out.shape))
            return out

    monkeypatch.setattr(be, "_import_verify_attn", lambda: SimpleNamespace(TreeAttentionPlan=Plan))
    n, bs, pool, width = 4, 2, 3, 32
    b = _bare_backend(n, pool, torch.randint(0, 500, (pool, width), dtype=torch.int32))
    b.use_mla = True
    b._va_slot_runs = 1
    b.va_plans_made = 0
    caches = [torch.zeros(600, 1, 576, dtype=torch.bfloat16) for _ in range(3)]
    b.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: caches[i])

    def layer(i, heads=16, scaling=0.1):
        return SimpleNamespace(layer_id=i, tp_q_head_num=heads, tp_k_head_num=1, qk_head_dim=576, v_head_dim=512,
                               scaling=scaling, logit_cap=0, sliding_window_size=-1)

    def batch():
        fb = _verify_fb(n, torch.tensor([2, 0]), torch.tensor([9, 20], dtype=torch.int32),
                        torch.randint(500, 600, (bs * n,), dtype=torch.int64), None, 1)
        b.init_forward_metadata(fb)
        return fb

    fb = batch()
    q = torch.zeros(bs * n, 16 * 576, dtype=torch.bfloat16)
    for i in range(3):
        b.forward_extend(q, None, None, layer(i), fb, save_kv_cache=False)
    assert len(made) == 1 and b.va_plans_made == 1 and len(runs) == 3
    assert [r[2] for r in runs] == [c.data_ptr() for c in caches]  # each layer its own cache
    kw = made[0]
    assert (kw["num_qo_heads"], kw["num_kv_heads"], kw["head_dim_qk"], kw["head_dim_vo"], kw["sm_scale"],
            kw["causal"], kw["max_q_len"], kw["page_size"]) == (16, 1, 576, 512, 0.1, True, n, 1)
    b.forward_extend(q, None, None, layer(0, scaling=0.2), fb, save_kv_cache=False)  # another scale
    assert len(made) == 2
    for i in range(3):  # alternating kinds of layers: one plan each, not one per switch
        b.forward_extend(q, None, None, layer(i, scaling=0.2 if i % 2 else 0.1), fb, save_kv_cache=False)
    assert len(made) == 2
    fb = batch()  # the next batch, of the same shape: its metadata in the same buffers, the plan reused
    for i in range(3):
        b.forward_extend(q, None, None, layer(i), fb, save_kv_cache=False)
    assert len(made) == 2 and b.va_plans_made == 2 and len(runs) == 10
    assert b.va_metadata.kv_indices.data_ptr() == b._va_eager["kv_indices"].data_ptr()
    # A batch of another size: a plan of its own, in the same (large enough) buffers.
    fb = _verify_fb(n, torch.tensor([1]), torch.tensor([12], dtype=torch.int32),
                    torch.randint(500, 600, (n,), dtype=torch.int64), None, 1)
    b.init_forward_metadata(fb)
    b.forward_extend(q[:n], None, None, layer(0), fb, save_kv_cache=False)
    assert len(made) == 3 and b.va_metadata.kv_indices.data_ptr() == b._va_eager["kv_indices"].data_ptr()


def test_eager_max_kv_len_rounding():
    """Eager plans bound max_kv_len by the longest request rounded up to one of 8 steps per power
    of two: at most 12.5% above it, never below it, 256 at least."""
    _sglang_or_skip()
    from verify_attn_sglang.backend import _round_up_kv

    assert [_round_up_kv(x) for x in (1, 256, 257, 300, 4096, 4097, 4600, 131072)] == \
        [256, 256, 288, 320, 4096, 4608, 4608, 131072]
    for x in range(1, 70000, 37):
        r = _round_up_kv(x)
        assert x <= r and (r <= 256 or r <= x * 1.125 + 1), (x, r)


def test_backend_checks_a_layer_once(monkeypatch):
    """A layer's attributes are checked at its first target verify only (a forward of many
    layers does not re-read them per layer and step); a refused layer is refused at every
    call; per-call arguments (sinks) are checked at every call."""
    _sglang_or_skip()
    from types import SimpleNamespace

    from verify_attn_sglang import backend as be

    class Plan:
        def __init__(self, *args, **kw):
            pass

        def run(self, q, k_cache, v_cache=None, *, out=None, **kw):
            return out

    monkeypatch.setattr(be, "_import_verify_attn", lambda: SimpleNamespace(TreeAttentionPlan=Plan))
    checked = []
    real_check = be.VerifyAttnBackend._va_check_layer

    def counting(self, layer, *a, **kw):
        checked.append(layer.layer_id)
        return real_check(self, layer, *a, **kw)

    monkeypatch.setattr(be.VerifyAttnBackend, "_va_check_layer", counting)
    n, bs = 4, 2
    b = _bare_backend(n, 3, torch.randint(0, 500, (3, 32), dtype=torch.int32))
    b.use_mla, b._va_slot_runs, b.va_plans_made = True, 1, 0
    b.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: torch.zeros(600, 1, 576, dtype=torch.bfloat16))
    layers = [SimpleNamespace(layer_id=i, tp_q_head_num=16, tp_k_head_num=1, qk_head_dim=576, v_head_dim=512,
                              scaling=0.1, logit_cap=0, sliding_window_size=-1) for i in range(3)]
    capped = SimpleNamespace(layer_id=9, tp_q_head_num=16, tp_k_head_num=1, qk_head_dim=576, v_head_dim=512,
                             scaling=0.1, logit_cap=30.0, sliding_window_size=-1)
    q = torch.zeros(bs * n, 16 * 576, dtype=torch.bfloat16)
    for _ in range(2):  # two verify steps
        fb = _verify_fb(n, torch.tensor([2, 0]), torch.tensor([9, 20], dtype=torch.int32),
                        torch.randint(500, 600, (bs * n,), dtype=torch.int64), None, 1)
        b.init_forward_metadata(fb)
        for layer in layers:
            b.forward_extend(q, None, None, layer, fb, save_kv_cache=False)
        for _ in range(2):
            with pytest.raises(NotImplementedError, match="layer 9 uses logit soft-capping"):
                b.forward_extend(q, None, None, capped, fb, save_kv_cache=False)
        with pytest.raises(NotImplementedError, match="attention sinks"):
            b.forward_extend(q, None, None, layers[0], fb, save_kv_cache=False, sinks=torch.zeros(16))
    assert checked.count(0) == 3 and checked.count(1) == 1 and checked.count(2) == 1 and checked.count(9) == 4


def test_backend_serves_unit_kv_scales(monkeypatch):
    """Checkpoints with fp8 weights give every attention layer k_scale / v_scale 1.0 even with a
    bf16 cache: served (as Triton serves them: K / 1.0 stored, read back times 1.0). Other
    scales, or scales never loaded (no k_scale_float), are refused naming the layer and values."""
    _sglang_or_skip()
    from types import SimpleNamespace

    from verify_attn_sglang import backend as be

    made = []

    class Plan:
        def __init__(self, *args, **kw):
            made.append(kw)

        def run(self, q, k_cache, v_cache=None, *, out=None, **kw):
            return out

    monkeypatch.setattr(be, "_import_verify_attn", lambda: SimpleNamespace(TreeAttentionPlan=Plan))
    n, bs = 4, 2
    b = _bare_backend(n, 3, torch.randint(0, 500, (3, 32), dtype=torch.int32))
    b.use_mla = True
    b._va_slot_runs = 1
    b.va_plans_made = 0
    b.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: torch.zeros(600, 1, 576, dtype=torch.bfloat16))
    fb = _verify_fb(n, torch.tensor([2, 0]), torch.tensor([9, 20], dtype=torch.int32),
                    torch.randint(500, 600, (bs * n,), dtype=torch.int64), None, 1)
    b.init_forward_metadata(fb)
    q = torch.zeros(bs * n, 16 * 576, dtype=torch.bfloat16)

    def layer(k_scale, v_scale, ks_float, vs_float):
        return SimpleNamespace(layer_id=7, tp_q_head_num=16, tp_k_head_num=1, qk_head_dim=576, v_head_dim=512,
                               scaling=0.1, logit_cap=0, sliding_window_size=-1, k_scale=k_scale,
                               v_scale=v_scale, k_scale_float=ks_float, v_scale_float=vs_float)

    one = torch.tensor(1.0)
    b.forward_extend(q, None, None, layer(one, one, 1.0, 1.0), fb, save_kv_cache=False)  # fp8-weight checkpoint
    b.forward_extend(q, None, None, layer(None, None, None, None), fb, save_kv_cache=False)
    assert len(made) == 1
    for bad in (layer(torch.tensor(0.5), one, 0.5, 1.0), layer(one, torch.tensor(2.0), 1.0, 2.0),
                layer(one, one, None, None)):
        with pytest.raises(NotImplementedError, match=r"layer 7 uses KV scales k_scale=.*only 1\.0 is served"):
            b.forward_extend(q, None, None, bad, fb, save_kv_cache=False)


@pytest.mark.parametrize("kv_cache_dtype,head_dim,use_mla,reason", [
    (torch.float8_e4m3fn, 128, False, None),
    (torch.float8_e4m3fn, 64, False, None),
    (torch.float8_e4m3fn, 256, False, None),
    (torch.float8_e4m3fn, 128, True, None),
    (torch.float8_e5m2, 128, False, "KV cache dtype torch.float8_e5m2"),
    (torch.float8_e5m2, 128, True, "KV cache dtype torch.float8_e5m2"),
])
def test_backend_fp8_pools(monkeypatch, kv_cache_dtype, head_dim, use_mla, reason):
    """An e4m3 pool is served for MLA and for MHA/GQA of every head dim served on
    bf16 (64, 128, 256); other fp8 pools leave target verify to Triton, saying why."""
    _sglang_or_skip()
    b = _constructed_backend(monkeypatch, "verify_attn", "verify_attn", kv_cache_dtype=kv_cache_dtype,
                             head_dim=head_dim, use_mla=use_mla)
    assert b.va_enabled == (reason is None), b.va_reason
    assert reason is None or b.va_reason.startswith(reason), b.va_reason
    assert b._va_kv_fp8 == (kv_cache_dtype == torch.float8_e4m3fn)


def _fp8_pool_backend(monkeypatch, use_mla):
    """A bare backend on an e4m3 pool whose plans record what they are made and run
    with: (backend, made, runs, forward batch of 2 requests x 4 drafts, its metadata
    initialised; the pool still to attach)."""
    from types import SimpleNamespace

    from verify_attn_sglang import backend as be

    made, runs = [], []

    class Plan:
        def __init__(self, *args, **kw):
            made.append(kw)

        def run(self, q, k_cache, v_cache=None, *, out=None, **kw):
            runs.append(kw)
            return out

    monkeypatch.setattr(be, "_import_verify_attn", lambda: SimpleNamespace(TreeAttentionPlan=Plan))
    n, bs = 4, 2
    b = _bare_backend(n, 3, torch.randint(0, 500, (3, 32), dtype=torch.int32))
    b.use_mla = use_mla
    b._va_kv_fp8 = True
    b._va_slot_runs = 1
    b.va_plans_made = 0
    fb = _verify_fb(n, torch.tensor([2, 0]), torch.tensor([9, 20], dtype=torch.int32),
                    torch.randint(500, 600, (bs * n,), dtype=torch.int64), None, 1, out_cache_loc_is_physical=True)
    b.init_forward_metadata(fb)
    return b, made, runs, fb


def test_backend_fp8_pool_runs_each_layer_with_its_scales(monkeypatch):
    """On an e4m3 pool: one plan for an fp8 cache per batch, each layer's run with its own
    k_scale / v_scale (the host floats; 1.0 for a layer without scales), the drafts' K / V
    stored with the layer's scales (as the Triton backend stores them); a scale tensor
    without its host value, or a v_scale without a k_scale, refused naming the layer."""
    _sglang_or_skip()
    from types import SimpleNamespace

    b, made, runs, fb = _fp8_pool_backend(monkeypatch, use_mla=False)
    stored = []
    pool8 = torch.zeros(600, 2, 128, dtype=torch.float8_e4m3fn)
    b.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: pool8, get_value_buffer=lambda i: pool8)
    b._set_kv_buffer = lambda fb, layer, loc, k, v, k_scale=None, v_scale=None: stored.append(
        (layer.layer_id, k_scale, v_scale))
    q = torch.zeros(8, 16 * 128, dtype=torch.bfloat16)
    kv = torch.zeros(8, 2, 128, dtype=torch.bfloat16)

    def layer(lid, ks, vs, ks_float=None, vs_float=None):
        t = lambda x: None if x is None else torch.tensor(x)  # noqa: E731
        return SimpleNamespace(layer_id=lid, tp_q_head_num=16, tp_k_head_num=2, qk_head_dim=128, v_head_dim=128,
                               scaling=0.1, logit_cap=0, sliding_window_size=-1, k_scale=t(ks), v_scale=t(vs),
                               k_scale_float=ks if ks_float is None else ks_float,
                               v_scale_float=vs if vs_float is None else vs_float)

    b.forward_extend(q, kv, kv, layer(0, 0.5, 2.0), fb)
    b.forward_extend(q, kv, kv, layer(1, 0.25, 4.0), fb)
    b.forward_extend(q, None, None, layer(2, None, None), fb, save_kv_cache=False)
    assert len(made) == 1 and made[0]["kv_dtype"] == torch.float8_e4m3fn
    assert runs == [dict(k_scale=0.5, v_scale=2.0), dict(k_scale=0.25, v_scale=4.0), dict(k_scale=1.0, v_scale=1.0)]
    assert [(lid, float(ks), float(vs)) for lid, ks, vs in stored] == [(0, 0.5, 2.0), (1, 0.25, 4.0)]
    no_float = SimpleNamespace(**{**vars(layer(3, 0.5, 2.0)), "k_scale_float": None})
    for bad in (no_float, layer(4, None, 2.0)):
        with pytest.raises(NotImplementedError, match=rf"layer {bad.layer_id} uses fp8 KV scales other than"):
            b.forward_extend(q, None, None, bad, fb, save_kv_cache=False)


def test_backend_fp8_mla_pool_runs_with_k_scale(monkeypatch):
    """MLA on an e4m3 pool: one fp8 plan, each layer's run with its k_scale only (the
    values are the latent cache's first columns, so they take k_scale), the drafts'
    latent stored as K / k_scale (the Triton backend's MLA write: the pool takes no
    scales); a v_scale other than the layer's k_scale refused naming the layer."""
    _sglang_or_skip()
    from types import SimpleNamespace

    b, made, runs, fb = _fp8_pool_backend(monkeypatch, use_mla=True)
    stored = []
    pool8 = torch.zeros(600, 1, 576, dtype=torch.float8_e4m3fn)
    b.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: pool8,
                                         set_kv_buffer=lambda layer, loc, k, v: stored.append((layer.layer_id, k, v)))
    b._set_kv_buffer = lambda *a, **kw: pytest.fail("MLA writes through the pool, unscaled by it")
    q = torch.zeros(8, 16 * 576, dtype=torch.bfloat16)
    k = torch.full((8, 1, 576), 3.0, dtype=torch.bfloat16)
    v = k[..., :512]

    def layer(lid, ks, vs):
        t = lambda x: None if x is None else torch.tensor(x)  # noqa: E731
        return SimpleNamespace(layer_id=lid, tp_q_head_num=16, tp_k_head_num=1, qk_head_dim=576, v_head_dim=512,
                               scaling=0.1, logit_cap=0, sliding_window_size=-1, k_scale=t(ks), v_scale=t(vs),
                               k_scale_float=ks, v_scale_float=vs)

    b.forward_extend(q, k, v, layer(0, 0.5, None), fb)
    b.forward_extend(q, k, v, layer(1, 0.25, 0.25), fb)
    b.forward_extend(q, None, None, layer(2, None, None), fb, save_kv_cache=False)
    assert len(made) == 1 and made[0]["kv_dtype"] == torch.float8_e4m3fn
    assert runs == [dict(k_scale=0.5, v_scale=None), dict(k_scale=0.25, v_scale=None),
                    dict(k_scale=1.0, v_scale=None)]
    assert [(lid, float(kk.float().max())) for lid, kk, _ in stored] == [(0, 6.0), (1, 12.0)]
    assert float(k.float().max()) == 3.0  # the caller's k untouched
    with pytest.raises(NotImplementedError, match=r"layer 3 uses an MLA v_scale 2.0 other than its k_scale 0.5"):
        b.forward_extend(q, None, None, layer(3, 0.5, 2.0), fb, save_kv_cache=False)


# A padded CUDA-graph replay as SGLang 0.5.23 builds it (decode_cuda_graph_runner.
# build_replay_fb_view): batch_size / req_pool_indices / seq_lens / seq_lens_cpu
# are the padded capture buffers (padded lanes: seq_len_fill_value 1, pool row 0),
# num_padding = bs - raw_bs, but out_cache_loc and spec_info (custom_mask) are the
# real batch's. Before the fix: scatter_draft_slots raised (bs * n slots indexed in
# raw_bs * n) and NGRAM's own raw_bs * n * n QLEN_ONLY mask was read as FULL.
@pytest.mark.parametrize("layout", ["qlen_own", "qlen_foreign", "full", "chain"])
def test_backend_padded_replay_metadata_cpu(layout):
    _sglang_or_skip()
    from types import SimpleNamespace

    rng = random.Random(17)
    n, raw_bs, bs, pool, width = 5, 3, 5, 6, 64
    req_to_token = torch.randint(0, 5000, (pool, width), dtype=torch.int32)
    b = _bare_backend(n, pool, req_to_token)
    b._va_alloc_graph(8)
    for name in ("kv_indices", "kv_indices64", "tree_mask"):  # stale buffers from an earlier replay
        b._va_graph[name].fill_(-3)
    req_pool_indices = torch.tensor([4, 1, 2, 0, 0])
    seq_lens = torch.tensor([10, 1, 33, 1, 1], dtype=torch.int32)
    out_cache_loc = torch.randint(5000, 6000, (raw_bs * n,), dtype=torch.int64)  # real requests only
    trees = [[-1] + [rng.randrange(i) for i in range(1, n)] for _ in range(raw_bs)]
    anc = [torch.tensor(_ancestors(t), dtype=torch.bool) for t in trees]
    qlen = torch.cat([a.reshape(-1) for a in anc])
    topk = 4
    if layout == "qlen_own":
        b._verify_mask.buffer.fill_(True)  # the padded lanes' part is stale
        b._verify_mask.buffer[: qlen.numel()] = qlen
        custom_mask = b._verify_mask.buffer
    elif layout == "qlen_foreign":  # NGRAM's own raw_bs * n * n buffer
        custom_mask = qlen.clone()
    elif layout == "full":
        custom_mask = _full_mask(seq_lens[:raw_bs].tolist(), trees)
    else:
        custom_mask, topk = torch.tril(torch.ones(n, n, dtype=torch.bool)).repeat(raw_bs, 1, 1).reshape(-1), 1
    view = _verify_fb(n, req_pool_indices, seq_lens, out_cache_loc, custom_mask, topk, num_padding=bs - raw_bs)
    b.init_forward_metadata_out_graph(view)
    m = b.va_metadata
    assert m.bs == bs and m.n == n
    assert m.qo_indptr.tolist() == list(range(0, (bs + 1) * n, n))
    assert m.kv_len.tolist() == [15, 6, 38, 6, 6]
    assert m.kv_indptr.tolist() == [0, 15, 21, 59, 65, 71]
    rows = []
    for r in range(bs):
        drafts = out_cache_loc[r * n:(r + 1) * n].tolist() if r < raw_bs else [0] * n  # the padding slot
        rows += req_to_token[req_pool_indices[r], : seq_lens[r]].tolist() + drafts
    assert m.kv_indices[:71].tolist() == rows
    if layout == "chain":
        assert m.causal and m.tree_mask is None
    else:
        assert not m.causal and tuple(m.tree_mask.shape) == (bs * n, 1)
        chain = [[c <= t for c in range(n)] for t in range(n)]
        assert _bits_to_rows(m.tree_mask, n) == [row for t in trees for row in _ancestors(t)] + chain * (bs - raw_bs)
        assert m.tree_mask.data_ptr() == b._va_graph["tree_mask"].data_ptr()
    bad = SimpleNamespace(**{**vars(view), "out_cache_loc": out_cache_loc[: n * (raw_bs - 1)]})
    with pytest.raises(ValueError, match="out_cache_loc"):
        b.init_forward_metadata_out_graph(bad)
    with pytest.raises(ValueError, match="num_padding"):
        b.init_forward_metadata_out_graph(SimpleNamespace(**{**vars(view), "num_padding": bs + 1}))


def _count_tril(monkeypatch):
    """Counts torch.tril calls from here on: the padded requests' causal rows are built with it."""
    calls = []
    tril = torch.tril
    monkeypatch.setattr(torch, "tril", lambda *a, **k: (calls.append(1), tril(*a, **k))[1])
    return calls


def test_tree_mask_bits_pad_rows_are_the_causal_rows(monkeypatch):
    """tree_mask_bits(pad_rows=causal_rows(n)) writes the same bits as building the padded
    requests' causal rows itself, and builds nothing per call."""
    rng = random.Random(29)
    n, bs, raw_bs = 5, 4, 1
    trees = [[-1] + [rng.randrange(i) for i in range(1, n)] for _ in range(raw_bs)]
    qlen = torch.cat([torch.tensor(_ancestors(t), dtype=torch.bool).reshape(-1) for t in trees])
    seq_lens = torch.tensor([7, 1, 1, 1], dtype=torch.int32)
    chain = [[c <= t for c in range(n)] for t in range(n)]
    ref = md.tree_mask_bits(qlen, seq_lens, n, raw_bs)
    assert _bits_to_rows(ref, n) == _ancestors(trees[0]) + chain * (bs - raw_bs)
    pad = md.causal_rows(n)
    assert pad.dtype == torch.int32 and tuple(pad.shape) == (n, 1) and _bits_to_rows(pad, n) == chain
    assert md.causal_rows(40).shape == (40, 2) and _bits_to_rows(md.causal_rows(40), 40)[39] == [True] * 40
    calls = _count_tril(monkeypatch)
    out = torch.empty(bs * n, 1, dtype=torch.int32)
    for _ in range(3):
        out.fill_(-3)  # stale rows of an earlier replay
        assert torch.equal(md.tree_mask_bits(qlen, seq_lens, n, raw_bs, out=out, pad_rows=pad), ref)
    assert calls == []
    assert torch.equal(md.tree_mask_bits(qlen, seq_lens, n, raw_bs, out=out), ref) and calls == [1]
    with pytest.raises(ValueError, match=r"^pad_rows: expected the causal rows \[5, 1\], got \(4, 1\)"):
        md.tree_mask_bits(qlen, seq_lens, n, raw_bs, pad_rows=md.causal_rows(4))


def test_backend_padded_replays_reuse_the_causal_rows(monkeypatch):
    """The CUDA-graph buffers keep the padded requests' causal rows, built once in
    _va_alloc_graph: padded replay preps copy them, never rebuild them (torch.tril + pack
    per prep before), and write the same bits as before (checked against the rows
    tree_mask_bits builds itself and against the hand-computed ancestry)."""
    _sglang_or_skip()
    rng = random.Random(31)
    n, bs, pool, width = 5, 5, 6, 64
    req_to_token = torch.randint(0, 5000, (pool, width), dtype=torch.int32)
    b = _bare_backend(n, pool, req_to_token)
    calls = _count_tril(monkeypatch)
    b._va_alloc_graph(8)
    assert calls == [1]
    req_pool_indices = torch.tensor([4, 1, 2, 0, 0])
    seq_lens = torch.tensor([10, 1, 33, 1, 1], dtype=torch.int32)
    chain = [[c <= t for c in range(n)] for t in range(n)]
    for raw_bs in (3, 1, 4, 5):  # fewer real requests after more: the padded rows must be reset
        trees = [[-1] + [rng.randrange(i) for i in range(1, n)] for _ in range(raw_bs)]
        qlen = torch.cat([torch.tensor(_ancestors(t), dtype=torch.bool).reshape(-1) for t in trees])
        out_cache_loc = torch.randint(5000, 6000, (raw_bs * n,), dtype=torch.int64)
        view = _verify_fb(n, req_pool_indices, seq_lens, out_cache_loc, qlen, 4, num_padding=bs - raw_bs)
        built = len(calls)
        b.init_forward_metadata_out_graph(view)
        assert len(calls) == built, f"raw_bs={raw_bs}: the prep rebuilt the causal rows"
        m = b.va_metadata
        assert m.tree_mask.data_ptr() == b._va_graph["tree_mask"].data_ptr()
        assert _bits_to_rows(m.tree_mask, n) == [row for t in trees for row in _ancestors(t)] + chain * (bs - raw_bs)
        assert torch.equal(m.tree_mask, md.tree_mask_bits(qlen, seq_lens, n, raw_bs))  # rows built per call


def _contract_metadata(calls):
    """Stand-in for verify_attn.uniform_verify_metadata on CPU tensors: its documented
    contract (kernels/verify_attn.h) as a host loop, recording what the backend passes."""
    from verify_attn import VerifyMetadata

    def f(prefix_len, draft_slots, n, *, draft_mask=None, kv_indices_capacity=None, pad_slot=0, out=None):
        B, R = prefix_len.shape[0], draft_slots.numel() // n
        calls.append(dict(R=R, draft_mask=draft_mask, out=out, cap=kv_indices_capacity))
        o = out if out is not None else VerifyMetadata(None, None, None, None, None)
        i32 = lambda t, k: t[:k] if t is not None else torch.empty(k, dtype=torch.int32)  # noqa: E731
        qo, kvp, kvl = i32(o.qo_indptr, B + 1), i32(o.kv_indptr, B + 1), i32(o.kv_len, B)
        kvi = o.kv_indices if o.kv_indices is not None else torch.empty(kv_indices_capacity, dtype=torch.int32)
        words = md.mask_words(n)
        tree = None
        if draft_mask is not None:
            tree = (o.tree_mask if o.tree_mask is not None else torch.empty(B * n, words, dtype=torch.int32))[: B * n]
        start = 0
        for r in range(B):
            p = int(prefix_len[r])
            qo[r], kvp[r], kvl[r] = r * n, start, p + n
            for t in range(n):
                kvi[start + p + t] = int(draft_slots[r * n + t]) if r < R else pad_slot
                if tree is not None:
                    vis = [bool(draft_mask[(r * n + t) * n + c]) if r < R else c <= t for c in range(n)]
                    tree[r * n + t] = md.pack_bool_rows(torch.tensor([vis]), words)[0]
            start += p + n
        qo[B], kvp[B] = B * n, start
        return VerifyMetadata(qo, kvp, kvi, kvl, tree)

    return f


# The GPU builder (_va_build_cuda: one va_verify_metadata launch + SGLang's pack) with
# the launch replaced by its contract: the same metadata as the torch builder, every
# byte-typed contiguous QLEN_ONLY mask handed to the launch (the real requests' rows,
# raw_bs of them), any other layout / dtype converted by torch into the same buffers.
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("layout,dtype,to_kernel", [("qlen_own", torch.bool, True), ("qlen_foreign", torch.uint8, True),
                                                    ("qlen_foreign", torch.int32, False), ("full", torch.bool, False),
                                                    ("chain", torch.bool, False), ("none", None, False)])
def test_backend_gpu_builder_matches_the_torch_builder(monkeypatch, graph, layout, dtype, to_kernel):
    _sglang_or_skip()
    from types import SimpleNamespace

    from verify_attn_sglang import backend as be

    calls = []
    monkeypatch.setattr(be, "_import_verify_attn", lambda: SimpleNamespace(
        uniform_verify_metadata=_contract_metadata(calls), VerifyMetadata=__import__("verify_attn").VerifyMetadata))
    rng = random.Random(41)
    n, raw_bs, bs, pool, width = 5, 3, 5 if graph else 3, 6, 64
    req_to_token = torch.randint(0, 5000, (pool, width), dtype=torch.int32)
    req_pool_indices = torch.tensor([4, 1, 2, 0, 0][:bs])
    seq_lens = torch.tensor([10, 1, 33, 1, 1][:bs], dtype=torch.int64)
    out_cache_loc = torch.randint(5000, 6000, (raw_bs * n,), dtype=torch.int64)
    trees = [[-1] + [rng.randrange(i) for i in range(1, n)] for _ in range(raw_bs)]
    qlen = torch.cat([torch.tensor(_ancestors(t), dtype=torch.bool).reshape(-1) for t in trees])
    metas = []
    for gpu in (False, True):
        b = _bare_backend(n, pool, req_to_token)
        if graph:
            b._va_alloc_graph(8)
            for name in ("kv_indices", "tree_mask", "kv_indptr", "kv_len"):
                b._va_graph[name].fill_(-3)
        if gpu:
            b._va_build_torch = b._va_build_cuda  # CPU tensors: take the GPU builder anyway
        topk, cm = 4, None
        if layout == "qlen_own":
            b._verify_mask.buffer.fill_(True)
            b._verify_mask.buffer[: qlen.numel()] = qlen
            cm = b._verify_mask.buffer
        elif layout == "qlen_foreign":
            cm = qlen.to(dtype)
        elif layout == "full":
            cm = _full_mask(seq_lens[:raw_bs].tolist(), trees)
        elif layout == "chain":
            cm, topk = torch.tril(torch.ones(n, n, dtype=torch.bool)).repeat(raw_bs, 1, 1).reshape(-1), 1
        extra = {"num_padding": bs - raw_bs} if graph else {}
        fb = _verify_fb(n, req_pool_indices, seq_lens, out_cache_loc, cm, topk, **extra)
        (b.init_forward_metadata_out_graph if graph else b.init_forward_metadata)(fb)
        metas.append((b, b.va_metadata))
    (_, ref), (b, got) = metas
    assert len(calls) == 1 and calls[0]["R"] == raw_bs
    assert (calls[0]["draft_mask"] is not None) == to_kernel
    # The launch writes into the backend's buffers: the CUDA-graph ones, or eager mode's
    # grow-only ones, sized for this batch's page table (prefix + drafts + the trash slot).
    bufs = b._va_graph if graph else b._va_eager
    assert calls[0]["out"].kv_indices is bufs["kv_indices"]
    assert (calls[0]["out"].tree_mask is not None) == to_kernel
    if not graph:
        assert bufs["cap"] == bufs["kv_indices"].numel() >= int(seq_lens.sum()) + bs * n + 1
    total = int(ref.kv_indptr[-1])
    for f in ("qo_indptr", "kv_indptr", "kv_len"):
        assert getattr(got, f).tolist() == getattr(ref, f).tolist(), f
    assert got.kv_indices.dtype == torch.int32 and got.kv_indices[:total].tolist() == ref.kv_indices[:total].tolist()
    assert (got.causal, got.max_kv_len) == (ref.causal, ref.max_kv_len)
    assert (got.tree_mask is None) == (ref.tree_mask is None)
    if ref.tree_mask is not None:
        assert got.tree_mask.tolist() == ref.tree_mask.tolist()
        if graph:
            assert got.tree_mask.data_ptr() == b._va_graph["tree_mask"].data_ptr()


# ForwardBatch._pad_inputs_to_size (DP attention / MLP sync, eager): req_pool_indices,
# seq_lens and out_cache_loc padded to bs, custom_mask not, the real count kept in
# _original_batch_size (no num_padding). A FULL mask of the real requests used to
# fail its size check against the padded lengths.
def test_backend_eager_dp_padded_batch_cpu():
    _sglang_or_skip()
    rng = random.Random(23)
    n, raw_bs, bs, pool, width = 4, 2, 4, 5, 64
    req_to_token = torch.randint(0, 5000, (pool, width), dtype=torch.int32)
    b = _bare_backend(n, pool, req_to_token)
    trees = [[-1] + [rng.randrange(i) for i in range(1, n)] for _ in range(raw_bs)]
    seq_lens = torch.tensor([7, 20, 1, 1], dtype=torch.int32)
    out_cache_loc = torch.cat([torch.randint(5000, 6000, (raw_bs * n,)), torch.zeros((bs - raw_bs) * n, dtype=torch.int64)])
    fb = _verify_fb(n, torch.tensor([3, 1, 0, 0]), seq_lens, out_cache_loc, _full_mask(seq_lens[:raw_bs].tolist(), trees), 4,
                    _original_batch_size=raw_bs)
    b.init_forward_metadata(fb)
    m = b.va_metadata
    chain = [[c <= t for c in range(n)] for t in range(n)]
    assert _bits_to_rows(m.tree_mask, n) == [row for t in trees for row in _ancestors(t)] + chain * (bs - raw_bs)
    # an idle DP rank relabelled TARGET_VERIFY (hybrid SSM models): no real request, an empty mask
    idle = _verify_fb(n, torch.tensor([0, 0]), torch.tensor([1, 1], dtype=torch.int32),
                      torch.zeros(2 * n, dtype=torch.int64), torch.zeros(0, dtype=torch.bool), 4,
                      _original_batch_size=0)
    b.init_forward_metadata(idle)
    assert _bits_to_rows(b.va_metadata.tree_mask, n) == chain * 2


def test_backend_refuses_capture_and_ragged_verify(monkeypatch):
    _sglang_or_skip()
    from types import SimpleNamespace

    n = 4
    b = _bare_backend(n, 4, torch.randint(0, 100, (4, 16), dtype=torch.int32))
    fb = _verify_fb(n, torch.tensor([1]), torch.tensor([3], dtype=torch.int32),
                    torch.arange(n, dtype=torch.int64), None, 1)
    b.init_forward_metadata(fb)  # fine eagerly
    # SGLang's metadata glue graph captures the prep: it reads this step's out_cache_loc
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="out_cache_loc"):
        b.init_forward_metadata(fb)
    monkeypatch.undo()
    fb.spec_info.ragged_verify_layout = SimpleNamespace(verify_lens=torch.tensor([2]))
    with pytest.raises(NotImplementedError, match="ragged"):
        b.init_forward_metadata(fb)


def test_sglang_modes_that_fall_back_to_triton(monkeypatch):
    _sglang_or_skip()
    from types import SimpleNamespace

    import sglang.srt.runtime_context as rc
    from verify_attn_sglang import backend as be

    def bag(**kw):
        return lambda: SimpleNamespace(**kw)

    monkeypatch.setattr(rc, "get_exec", bag(overlap=SimpleNamespace(enable_two_batch_overlap=False)))
    monkeypatch.setattr(rc, "get_disagg", bag(enable_pdmux=False))
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)
    assert be._sglang_mode_reason() is None
    monkeypatch.setattr(rc, "get_exec", bag(overlap=SimpleNamespace(enable_two_batch_overlap=True)))
    assert "two-batch overlap" in be._sglang_mode_reason()
    monkeypatch.setattr(rc, "get_exec", bag(overlap=SimpleNamespace(enable_two_batch_overlap=False)))
    monkeypatch.setattr(rc, "get_disagg", bag(enable_pdmux=True))
    assert "PD multiplexing" in be._sglang_mode_reason()
    monkeypatch.setattr(rc, "get_disagg", bag(enable_pdmux=False))
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    assert "ragged" in be._sglang_mode_reason()

    def unpublished():
        raise ValueError("exec not published")

    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE")
    monkeypatch.setattr(rc, "get_exec", unpublished)
    monkeypatch.setattr(rc, "get_disagg", unpublished)
    assert be._sglang_mode_reason() is None


def _constructed_backend(monkeypatch, prefill, decode, spec_mode=None, kv_cache_dtype=torch.bfloat16, head_dim=128,
                         use_mla=False):
    """VerifyAttnBackend.__init__ with TritonAttnBackend.__init__ stubbed to the
    attributes ours reads (that one needs a GPU): a GQA D128 model, 4 drafts."""
    from types import SimpleNamespace

    import sglang.srt.runtime_context as rc
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from verify_attn_sglang import backend as be

    def triton_init(self, model_runner, skip_prefill=False, kv_indptr_buf=None, **kw):
        self.skip_prefill, self.num_draft_tokens, self.dcp_size = skip_prefill, 4, 1
        self.sliding_window_size, self.enable_deterministic, self.use_mla = None, False, use_mla
        self.num_head, self.num_kv_head, self.page_size = 8, 2, 1
        self.device, self.max_context_len = torch.device("cpu"), 64

    monkeypatch.setattr(TritonAttnBackend, "__init__", triton_init)
    if spec_mode is not None:
        monkeypatch.setattr(rc, "get_spec", lambda: SimpleNamespace(
            speculative_attention_mode=spec_mode, speculative_algorithm="NGRAM",
            speculative_draft_attention_backend="triton"))
    runner = SimpleNamespace(
        is_draft_worker=False, kv_cache_dtype=kv_cache_dtype, req_to_token_pool=SimpleNamespace(size=4),
        model_config=SimpleNamespace(head_dim=head_dim, is_encoder_decoder=False, kv_lora_rank=512,
                                     qk_rope_head_dim=64),
        prefill_attention_backend_str=prefill, decode_attention_backend_str=decode)
    return be.VerifyAttnBackend(runner)


@pytest.mark.parametrize("prefill,decode,mode,serves", [
    ("verify_attn", "verify_attn", "prefill", True),
    ("verify_attn", "triton", "prefill", True),
    ("verify_attn", "triton", "decode", False),   # D5: verify runs on Triton, NGRAM must keep FULL
    ("triton", "verify_attn", "decode", True),
    ("triton", "verify_attn", "prefill", False),
])
def test_backend_serves_only_the_verify_side(monkeypatch, prefill, decode, mode, serves):
    """With two backends, ours serves target verify (and switches NGRAM to the compact
    mask, a process-wide setting) only when SGLang runs target verify on it
    (--speculative-attention-mode); otherwise NGRAM keeps the FULL mask the other
    backend reads."""
    _sglang_or_skip()
    import sys
    import types

    import sglang.srt.speculative as spec_pkg

    # NGRAM's worker module needs sgl_kernel to import: a stand-in with its switch
    ngram_worker = types.ModuleType("sglang.srt.speculative.ngram_worker")
    ngram_worker.USE_FULL_MASK = True
    monkeypatch.setitem(sys.modules, ngram_worker.__name__, ngram_worker)
    monkeypatch.setattr(spec_pkg, "ngram_worker", ngram_worker, raising=False)
    b = _constructed_backend(monkeypatch, prefill, decode, mode)
    assert b.va_enabled is serves, b.va_reason
    assert ngram_worker.USE_FULL_MASK is (not serves)
    if not serves:
        other = "decode" if mode == "decode" else "prefill"
        assert f"SGLang runs target verify on the {other} backend 'triton'" in b.va_reason


def test_dflash_mask_policy_names_the_backend(monkeypatch):
    """DFlash gives a backend off its list the graph runner's all-ones custom mask at
    capture; after construction VerifyAttnBackend is on the list (served causally, no mask)."""
    _sglang_or_skip()
    from sglang.srt.speculative import dflash_utils

    from verify_attn_sglang import backend as be

    original = frozenset(n for n in dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS if n != "VerifyAttnBackend")
    monkeypatch.setattr(dflash_utils, "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS", original)
    bare = _bare_backend(4, 2, torch.zeros(2, 8, dtype=torch.int32))
    assert dflash_utils.resolve_dflash_verify_mask_policy(bare) == ("VerifyAttnBackend", True)
    _constructed_backend(monkeypatch, "verify_attn", "verify_attn")
    assert dflash_utils.resolve_dflash_verify_mask_policy(bare) == ("VerifyAttnBackend", False)
    assert original < dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS  # the others kept
    be.register_dflash_mask_policy()  # idempotent
    assert dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS == original | {"VerifyAttnBackend"}


def test_draft_backend_note(monkeypatch):
    """Without --speculative-draft-attention-backend the draft silently takes SGLang's
    fallback (verify_attn is no draft backend): the backend says what to pass."""
    _sglang_or_skip()
    from types import SimpleNamespace

    import sglang.srt.runtime_context as rc
    from verify_attn_sglang import backend as be

    def spec(algo, draft):
        monkeypatch.setattr(rc, "get_spec", lambda: SimpleNamespace(
            speculative_algorithm=algo, speculative_draft_attention_backend=draft))

    spec("EAGLE", None)
    note = be.draft_backend_note()
    assert "--speculative-draft-attention-backend triton" in note and "EAGLE" in note
    spec("EAGLE", "triton")
    assert be.draft_backend_note() is None
    spec(None, None)
    assert be.draft_backend_note() is None


def test_graph_replay_refuses_another_draft_count():
    """The CUDA-graph buffers and captured launches are made for num_draft_tokens per
    request; a target verify with another count raises instead of being read wrongly."""
    _sglang_or_skip()
    n, bs, pool = 6, 2, 4
    b = _bare_backend(n, pool, torch.randint(0, 500, (pool, 64), dtype=torch.int32))
    b._va_alloc_graph(4)
    seq_lens = torch.tensor([10, 3], dtype=torch.int32)
    for m in (n - 2, n + 1):
        fb = _verify_fb(m, torch.tensor([1, 2]), seq_lens, torch.randint(500, 600, (bs * m,), dtype=torch.int64),
                        None, 1)
        with pytest.raises(ValueError, match=rf"has {m} draft tokens per request, but the CUDA-graph buffers "
                                             rf"were made for {n}"):
            b.init_forward_metadata_out_graph(fb)
    fb = _verify_fb(n, torch.tensor([1, 2]), seq_lens, torch.randint(500, 600, (bs * n,), dtype=torch.int64), None, 1)
    b.init_forward_metadata_out_graph(fb)
    assert b.va_metadata.n == n


def test_eager_page_table_sized_from_host_lengths():
    """Eager target verify sizes its page table from seq_lens_sum, else from seq_lens_cpu
    (the backend asks the scheduler for them: needs_cpu_seq_lens), and only without
    either from bs x max_context_len."""
    _sglang_or_skip()
    from verify_attn_sglang.backend import VerifyAttnBackend

    assert VerifyAttnBackend.needs_cpu_seq_lens is True
    n, bs, pool, ctx = 4, 2, 4, 1000
    b = _bare_backend(n, pool, torch.randint(0, 500, (pool, ctx), dtype=torch.int32), max_context_len=ctx)
    seq_lens = torch.tensor([10, 3], dtype=torch.int32)
    exact = 13 + bs * n + 1
    for sum_, cpu, want in ((13, seq_lens.clone(), exact), (None, seq_lens.clone(), exact),
                            (None, None, bs * ctx + bs * n + 1)):
        fb = _verify_fb(n, torch.tensor([1, 2]), seq_lens, torch.randint(500, 600, (bs * n,), dtype=torch.int64),
                        None, 1)
        fb.seq_lens_sum, fb.seq_lens_cpu = sum_, cpu
        b.init_forward_metadata(fb)
        assert b.va_metadata.kv_indices.numel() == want
        assert b.va_metadata.kv_indptr.tolist() == [0, 14, 21]


def test_metadata_helpers_refuse_bad_sizes():
    n = 4
    seq_lens = torch.tensor([3, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="mask"):
        md.qlen_only_to_bits(torch.ones(2 * n * n - 1, dtype=torch.bool), 2, n)
    full_ok = torch.ones(n * (3 + n + 9 + n), dtype=torch.bool)
    assert md.full_mask_to_bits(full_ok, seq_lens, n, seq_lens_cpu=seq_lens).shape == (2 * n, 1)
    with pytest.raises(ValueError, match="mask"):
        md.full_mask_to_bits(full_ok[:-1], seq_lens, n, seq_lens_cpu=seq_lens)
    with pytest.raises(ValueError, match="out_cache_loc"):
        md.scatter_draft_slots(torch.zeros(40, dtype=torch.int64), md.verify_kv_indptr(seq_lens, n), seq_lens,
                               torch.zeros(2 * n - 1, dtype=torch.int64), n)
    with pytest.raises(ValueError, match="^out:"):
        md.verify_kv_indptr(seq_lens, n, out=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="^out:"):
        md.verify_kv_len(seq_lens, n, out=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="^out:"):
        md.uniform_qo_indptr(2, n, out=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="^n:"):
        md.verify_kv_len(seq_lens, 0)
    with pytest.raises(ValueError, match="real_bs"):
        md.tree_mask_bits(torch.ones(2 * n * n, dtype=torch.bool), seq_lens, n, 3)
    with pytest.raises(ValueError, match="num_padding"):
        md.real_batch_size(2, -1)
    assert md.real_batch_size(4, None) == 4 and md.real_batch_size(4, 3) == 1
    # a raw_bs * n * n QLEN_ONLY mask is QLEN_ONLY for raw_bs, not for the padded batch
    qlen = torch.tril(torch.ones(n, n, dtype=torch.bool)).repeat(1, 1, 1).reshape(-1)
    assert md.is_qlen_only_layout(qlen, 1, n) and not md.is_qlen_only_layout(qlen, 2, n)


def test_backend_verify_mask_is_qlen_only():
    _sglang_or_skip()
    b = _bare_backend(16, 64, torch.zeros(1, 1, dtype=torch.int32), max_context_len=131072)
    vm = b.verify_mask
    assert vm.mode.name == "QLEN_ONLY" and vm.buffer.numel() == 64 * 16 * 16 and vm.buffer.dtype == torch.bool
    from sglang.srt.layers.attention.verify_mask import tree_mask_numel
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    assert tree_mask_numel(TreeMaskMode.FULL_MASK, 64, 16, 131072) == md.full_mask_bytes(64, 16, 131072)


# ----------------------------------------------------------------------------- the kit's CUDA-graph fixture, on CPU
#
# test_backend_gpu.py::test_kit_target_verify_cuda_graph failed on the H200 for
# every config but GQA page_size 16, in the eager leg the kit runs on its graph
# fixture (speculative_cuda_graph_runner.py:~203). This rebuilds that fixture
# exactly as the runner does (same case names, hence the same seeds and slot
# permutations; a CPU stand-in backend; fp32), then checks our target-verify
# metadata against Triton's and runs verify_attn's semantics over the cache in
# torch. Cause (kit_compat.py): the kit's prepare_inputs re-writes the prefix
# K/V at contiguous slots while req_to_token holds the shuffled ones, so any
# backend reading the prefix through req_to_token (Triton too) reads clobbered
# rows; our metadata is Triton's, row for row.

KIT_CTX = 128
KIT_CONFIGS = [(a, k, p) for a in ("mla", "gqa") for k in (1, 4) for p in (1, 16)]
# prefix rows the kit's own prepare_inputs clobbers (all in request 1): the GPU
# run's failures are exactly the configs with a nonzero count
KIT_CLOBBERED = {("mla", 1, 1): 10, ("mla", 1, 16): 16, ("mla", 4, 1): 10, ("mla", 4, 16): 16,
                 ("gqa", 1, 1): 10, ("gqa", 1, 16): 0, ("gqa", 4, 1): 10, ("gqa", 4, 16): 0}


class _KitTC:
    def skipTest(self, reason):  # the kit's fixture builders call testcase.skipTest
        pytest.skip(reason)


def _kit_graph_fixture(monkeypatch, arch, topk, page_size):
    """The runner's graph fixture and eager-leg batch (before prepare_inputs)."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention as dense
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention as mla
    from sglang.test.kits.attention_unittest.runner_modes import speculative_target_verify_runner as tv

    monkeypatch.setitem(ATTENTION_BACKENDS, "va_cpu_probe", lambda runner: SimpleNamespace(
        token_to_kv_pool=runner.token_to_kv_pool, req_to_token_pool=runner.req_to_token_pool))
    n = 4 if topk == 1 else 3
    name = f"va_cg_{arch}_k{topk}_p{page_size}"  # test_backend_gpu's names: the kit seeds from them
    common = dict(name=name, backend="va_cpu_probe", forward_mode=ForwardMode.TARGET_VERIFY, page_size=page_size,
                  prefix_lens=(5, 37), extend_lens=(n, n))
    graph = dict(max_context_len=KIT_CTX, dtype=torch.float32, device="cpu", disable_cuda_graph=False,
                 runner_batch_size=4)
    if arch == "mla":
        case = mla.MLAAttentionCase(num_heads=16, **common)
        fx = mla.build_mla_attention_fixture(_KitTC(), case, kv_lora_rank=512, qk_rope_head_dim=64,
                                             hidden_size=256, **graph)
        inputs, ref_fn = mla.mla_fixture_inputs(fx), mla.mla_attention_reference_with_custom_mask
    else:
        case = dense.DenseAttentionCase(num_heads=8, num_kv_heads=2, **common)
        fx = dense.build_dense_attention_fixture(_KitTC(), case, head_dim=128, hidden_size=256, **graph)
        inputs, ref_fn = dense.dense_fixture_inputs(fx), dense.dense_attention_reference_with_custom_mask
    batch = fx.forward_batch
    tv._prepare_spec_verify_batch(case, batch, topk=topk, spec_kind="eagle", device="cpu")  # adapter.prepare_batch
    expected = tv._target_verify_expected_output(reference_fn=ref_fn, fixture=fx, case=case, inputs=inputs,
                                                 topk=topk, spec_kind="eagle", device="cpu")
    return fx, case, batch, inputs, expected, n


def _prefix_rows_clobbered(arch, fx, case, inputs):
    """Prefix positions whose req_to_token slot does not hold that position's K."""
    r2t = fx.runner.req_to_token_pool.req_to_token
    kbuf = fx.runner.token_to_kv_pool.get_key_buffer(0)
    bad = 0
    for r, p in enumerate(case.prefix_lens):
        if arch == "mla":
            _, k, _, kr = fx.actual_module.forward_absorb_prepare(inputs["prefix_hidden"][r])
            want = torch.cat([k, kr], -1).reshape(p, -1)
        else:
            want = fx.actual_module.project_qkv(inputs["prefix_hidden"][r])[1].reshape(p, -1)
        got = kbuf[r2t[r, :p].long()].reshape(p, -1)
        bad += int(((got - want).abs().amax(1) > 1e-5).sum())
    return bad


def _verify_attn_semantics(m, q, k_cache, v_cache, scale):
    """What verify_attn computes from our metadata (torch, fp32): request r's
    queries see rows kv_indices[kv_indptr[r] : +kv_len[r]], the prefix fully and
    draft c by the tree-mask bit (or c <= t when causal)."""
    n = m.n
    outs = []
    for r in range(m.bs):
        s, L = int(m.kv_indptr[r]), int(m.kv_len[r])
        rows = m.kv_indices[s:s + L].long()
        K, V = k_cache[rows].float(), v_cache[rows].float()  # [L, Hk, D]
        g = q.shape[1] // K.shape[1]
        K, V = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)
        for t in range(n):
            if m.causal:
                draft_vis = [c <= t for c in range(n)]
            else:
                word = m.tree_mask[r * n + t].tolist()
                draft_vis = [bool((word[c // 32] >> (c % 32)) & 1) for c in range(n)]
            vis = torch.tensor([True] * (L - n) + draft_vis)
            sc = torch.einsum("hd,khd->hk", q[r * n + t].float(), K[vis]) * scale
            outs.append(torch.einsum("hk,khd->hd", sc.softmax(-1), V[vis]))
    return torch.stack(outs)  # [T, H, Dv]


def _run_emulated(arch, fx, batch, inputs, m):
    """The fixture module's forward (its K/V writes to out_cache_loc included),
    with the attention computed by _verify_attn_semantics over our metadata."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    mod, pool = fx.actual_module, fx.runner.token_to_kv_pool
    x = inputs["input_hidden"]
    if arch == "mla":
        q_nope, k_nope, q_rope, k_rope = mod.forward_absorb_prepare(x)
        with forward_context(ForwardContext(attn_backend=fx.backend)):
            mod.write_kv_cache(batch.out_cache_loc, k_nope, k_rope)
        kc = pool.get_key_buffer(0)
        o = _verify_attn_semantics(m, torch.cat([q_nope, q_rope], -1), kc, kc[..., : mod.kv_lora_rank],
                                   mod.attn_mqa.scaling)
        o = torch.bmm(o.transpose(0, 1), mod.w_vc.float()).transpose(0, 1)
        return mod.o_proj(o.flatten(1, 2))
    q, k, v = mod.project_qkv(x)
    H, Hk, D = mod.num_heads, mod.num_kv_heads, mod.head_dim
    pool.set_kv_buffer(mod.attn, batch.out_cache_loc, k.view(-1, Hk, D), v.view(-1, Hk, D))
    o = _verify_attn_semantics(m, q.view(-1, H, D), pool.get_key_buffer(0), pool.get_value_buffer(0),
                               mod.attn.scaling)
    return mod.o_proj(o.reshape(o.shape[0], -1))


# A CPU emulation (fp32 probe backend, fixtures built on the CPU): on the GPU
# machine the kit builds its fixtures on CUDA with SGLang's JIT kernels, and
# test_backend_gpu.py runs the real thing instead.
@pytest.mark.skipif(os.environ.get("VERIFY_ATTN_SGLANG_GPU") == "1",
                    reason="CPU emulation of the kit's graph fixture; the GPU run uses test_backend_gpu.py")
@pytest.mark.parametrize("prepare", ["kit", "fixed"])
@pytest.mark.parametrize("arch,topk,page_size", KIT_CONFIGS)
def test_kit_graph_fixture_target_verify(monkeypatch, arch, topk, page_size, prepare):
    _sglang_or_skip()
    import kit_compat
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention as dense
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention as mla
    from sglang.test.kits.attention_unittest.runner_modes import speculative_target_verify_runner as tv

    torch.set_grad_enabled(False)
    try:
        fx, case, batch, inputs, expected, n = _kit_graph_fixture(monkeypatch, arch, topk, page_size)
        assert _prefix_rows_clobbered(arch, fx, case, inputs) == 0  # as built
        # the runner's adapter.prepare_inputs (the kit's), or kit_compat's fix
        if prepare == "kit":
            kit_prep = mla.prepare_mla_runner_inputs if arch == "mla" else dense.prepare_dense_runner_inputs
        else:
            kit_prep = kit_compat.prepare_mla_runner_inputs if arch == "mla" else kit_compat.prepare_dense_runner_inputs
        kit_prep(fx, case, batch, inputs, max_context_len=KIT_CTX)
        clobbered = _prefix_rows_clobbered(arch, fx, case, inputs)
        assert clobbered == (KIT_CLOBBERED[(arch, topk, page_size)] if prepare == "kit" else 0)

        # our metadata on this batch (the backend's own CPU path) ...
        r2t = fx.runner.req_to_token_pool.req_to_token
        b = _bare_backend(n, 4, r2t, max_context_len=KIT_CTX)
        b.init_forward_metadata(batch)
        m = b.va_metadata
        assert m.bs == 2 and m.n == n and m.causal == (topk == 1)
        assert m.qo_indptr.tolist() == [0, n, 2 * n]
        assert m.kv_len.tolist() == [5 + n, 37 + n]
        # ... is Triton's, row for row: its kv_indices (create_flashinfer_kv_indices_triton
        # over req_to_token[req_pool_indices[r], :seq_lens[r]]) then the drafts, whose
        # K/V it takes from forward_extend's k/v = what the forward wrote at out_cache_loc
        for r in range(2):
            s = int(m.kv_indptr[r])
            triton_prefix = r2t[int(batch.req_pool_indices[r]), : int(batch.seq_lens[r])].tolist()
            ours = m.kv_indices[s: s + int(m.kv_len[r])].tolist()
            assert ours == triton_prefix + batch.out_cache_loc[r * n:(r + 1) * n].tolist()
        want = tv._draft_tree_mask(draft_token_num=n, topk=topk, device="cpu")  # the kit's tree / chain
        if m.causal:  # top-k 1: the kit's chain is exactly causal
            assert m.tree_mask is None and torch.equal(want, torch.tril(torch.ones(n, n, dtype=torch.bool)))
        else:  # parents (-1, 0, 0), converted from the kit's FULL mask
            assert _bits_to_rows(m.tree_mask, n) == want.tolist() * 2

        # verify_attn's semantics over the cache with that metadata, vs the kit's reference
        err = (_run_emulated(arch, fx, batch, inputs, m) - expected).abs().max().item()
        print(f"VA_KIT_CG {arch} topk={topk} page_size={page_size} prepare={prepare} clobbered={clobbered} err={err:.3e}")
        if clobbered:
            assert err > 3e-2, err  # the GPU failure, whatever the backend: wrong prefix rows
        else:
            assert err < 1e-3, err
    finally:
        torch.set_grad_enabled(True)
