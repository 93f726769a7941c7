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
    trees = []
    full = []
    for p in seq_lens.tolist():
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        trees.append(parents)
        anc = torch.tensor(_ancestors(parents), dtype=torch.bool)
        req = torch.ones(n, p + n, dtype=torch.bool)
        req[:, p:] = anc
        full.append(req.reshape(-1))
    full = torch.cat(full)
    qlen = torch.cat([torch.tensor(_ancestors(t), dtype=torch.bool).reshape(-1) for t in trees])
    b_full = md.full_mask_to_bits(full, seq_lens, n)
    b_qlen = md.qlen_only_to_bits(qlen, 4, n)
    assert tuple(b_full.shape) == (4 * n, 2)
    assert torch.equal(b_full, b_qlen)
    expect = [row for t in trees for row in _ancestors(t)]
    assert _bits_to_rows(b_full, n) == expect


def test_bits_agree_with_verify_attn_masks():
    """Same bits as verify_attn.masks (the library's own converters) on a random batch."""
    pytest.importorskip("verify_attn.masks")
    from verify_attn import masks

    rng = random.Random(11)
    n, bs = 16, 5
    parents = []
    for _ in range(bs):
        parents += masks.random_parents("ddtree", n, rng=rng)
    qo = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
    ref = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo)
    qlen = torch.cat([torch.tensor(_ancestors(parents[i * n:(i + 1) * n])).reshape(-1) for i in range(bs)])
    assert torch.equal(md.qlen_only_to_bits(qlen, bs, n), ref)
    assert torch.equal(masks.from_sglang_qlen_only(qlen, qo), ref)


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
    b.device = torch.device("cpu")
    b.req_to_token = req_to_token
    b._va_graph = None
    b._va_max_bs = max_bs
    b._verify_mask = b._va_make_verify_mask(max_bs)
    return b


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("layout", ["qlen_own", "qlen_foreign", "full", "chain"])
def test_backend_target_verify_metadata_cpu(graph, layout):
    _sglang_or_skip()
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

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
        parts = []
        for p, a in zip(seq_lens.tolist(), anc):
            m = torch.ones(n, p + n, dtype=torch.bool)
            m[:, p:] = a
            parts.append(m.reshape(-1))
        custom_mask = torch.cat(parts)
    else:
        custom_mask, topk = torch.tril(torch.ones(n, n, dtype=torch.bool)).repeat(bs, 1, 1).reshape(-1), 1
    fb = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        spec_info=SimpleNamespace(custom_mask=custom_mask, topk=topk, num_tokens_per_req=n),
        req_pool_indices=req_pool_indices, seq_lens=seq_lens, seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.clone(), out_cache_loc=out_cache_loc, kv_loc_plan=None, batch_size=bs,
    )
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
    assert m.max_kv_len == (64 + n if graph else 33 + n)
    if layout == "chain":
        assert m.causal and m.tree_mask is None
    else:
        assert not m.causal
        assert _bits_to_rows(m.tree_mask, n) == [row for t in trees for row in _ancestors(t)]
        if graph:
            assert m.tree_mask.data_ptr() == b._va_graph["tree_mask"].data_ptr()
    if graph:  # CUDA-graph buffers are written in place, never reallocated
        assert m.kv_indices.data_ptr() == b._va_graph["kv_indices"].data_ptr()
        assert m.kv_indptr.data_ptr() == b._va_graph["kv_indptr"].data_ptr()


def test_backend_verify_mask_is_qlen_only():
    _sglang_or_skip()
    b = _bare_backend(16, 64, torch.zeros(1, 1, dtype=torch.int32), max_context_len=131072)
    vm = b.verify_mask
    assert vm.mode.name == "QLEN_ONLY" and vm.buffer.numel() == 64 * 16 * 16 and vm.buffer.dtype == torch.bool
    from sglang.srt.layers.attention.verify_mask import tree_mask_numel
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    assert tree_mask_numel(TreeMaskMode.FULL_MASK, 64, 16, 131072) == md.full_mask_bytes(64, 16, 131072)
