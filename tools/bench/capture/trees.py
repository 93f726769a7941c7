"""Draft trees of tree speculative decoding: DDTree best-first and EAGLE top-k.

Conventions (the ones serving engines use for the verify step; the lossless
check in ``python/tests/test_lossless.py`` proves them on a real model):

* A tree has ``N = q_len`` nodes in TOPOLOGICAL order (``parents[i] < i``).
  Node 0 is the ROOT: the last committed token (the previous step's bonus
  token), whose KV is not yet in the cache. ``parents[0] = -1`` (attached to
  the committed prefix); every other node has a parent in the tree.
* ``depths[0] = 0``; a child is one deeper than its parent. A node of depth
  ``d`` sits at sequence position ``prefix_len + d``, where ``prefix_len`` is
  the number of committed KV rows (so the root sits right after the prefix,
  and a depth-``d`` node is a candidate for position ``prefix_len + d``).
  RoPE uses that position.
* The verify step's query rows are the ``N`` nodes in this order, and the
  request's last ``N`` KV rows are the same nodes (verify_attn's layout). Row
  ``t`` sees the prefix, its ancestors and itself:
  ``verify_attn.masks.from_parents(parents, qo_indptr)``.
* Budgets count ALL nodes including the root, so a budget-64 tree is a
  ``q_len = 64`` verify. An EAGLE tree of depth ``D`` and top-k ``k`` has
  ``1 + k + (D - 1) * k * k`` nodes (69 for 5 x 4).
* Sibling tokens are distinct, so greedy acceptance is unambiguous.
"""

import heapq
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ["DraftTree", "ddtree", "eagle", "chain", "accept_greedy", "eagle_size"]


@dataclass
class DraftTree:
    tokens: torch.Tensor  # int64 [N]; node 0 = root
    parents: torch.Tensor  # int64 [N]; -1 for the root, else < own index
    depths: torch.Tensor  # int64 [N]; root 0
    scores: torch.Tensor  # float64 [N]; cumulative drafter log-prob (root 0)
    kind: str = ""

    def __len__(self) -> int:
        return int(self.tokens.numel())

    def positions(self, prefix_len: int) -> torch.Tensor:
        """Sequence positions of the nodes (RoPE): ``prefix_len + depth``."""
        return self.depths + int(prefix_len)

    def children(self) -> List[Dict[int, int]]:
        """``children()[i]`` maps token -> child node index."""
        ch: List[Dict[int, int]] = [dict() for _ in range(len(self))]
        for i, (p, t) in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
            if p >= 0:
                ch[p][t] = i
        return ch

    def validate(self) -> None:
        n = len(self)
        par, dep, tok = self.parents.tolist(), self.depths.tolist(), self.tokens.tolist()
        if n < 1 or par[0] != -1 or dep[0] != 0:
            raise ValueError("tree: node 0 must be the root (parent -1, depth 0)")
        seen = set()
        for i in range(1, n):
            if not 0 <= par[i] < i:
                raise ValueError(f"tree: node {i} has parent {par[i]}; not topological")
            if dep[i] != dep[par[i]] + 1:
                raise ValueError(f"tree: node {i} has depth {dep[i]}, parent depth {dep[par[i]]}")
            key = (par[i], tok[i])
            if key in seen:
                raise ValueError(f"tree: node {i} repeats a sibling's token {tok[i]}")
            seen.add(key)

    def path_to(self, i: int) -> List[int]:
        out = []
        par = self.parents.tolist()
        while i >= 0:
            out.append(i)
            i = par[i]
        return out[::-1]


def _make(tokens, parents, depths, scores, kind) -> DraftTree:
    t = DraftTree(
        torch.tensor(tokens, dtype=torch.int64),
        torch.tensor(parents, dtype=torch.int64),
        torch.tensor(depths, dtype=torch.int64),
        torch.tensor(scores, dtype=torch.float64),
        kind,
    )
    t.validate()
    return t


def ddtree(root_token: int, depth_logprobs: torch.Tensor, budget: int, kind: Optional[str] = None) -> DraftTree:
    """DDTree-style best-first tree under a node budget.

    A block drafter (DFlash) gives one distribution per depth,
    ``depth_logprobs[d - 1]`` = log-probabilities of the token at depth ``d``
    (``[L, V]``), independent of the branch. A node's score is the sum of its
    path's log-probabilities; the tree holds the root plus the ``budget - 1``
    highest-scoring token sequences of length ``1..L`` (ties: first found).
    They are prefix-closed (a prefix scores at least as high), so they form a
    tree.

    Best-first: a heap of candidates, each (parent, depth, rank within that
    depth's sorted list). Popping a candidate makes it a node and pushes its
    next sibling (rank + 1) and its first child (rank 0 one level deeper). Both
    score no more than the popped one, so nodes come out in non-increasing score
    order, parents before children (topological).
    """
    budget = int(budget)
    if budget < 1:
        raise ValueError(f"budget: must be >= 1, got {budget}")
    lp = depth_logprobs.to(torch.float64)
    if lp.dim() != 2:
        raise ValueError(f"depth_logprobs: expected [L, V], got {tuple(lp.shape)}")
    L, V = lp.shape
    K = max(1, min(V, budget - 1))
    vals_t, idx_t = torch.topk(lp, K, dim=-1)  # sorted descending
    vals, idx = vals_t.tolist(), idx_t.tolist()
    tokens, parents, depths, scores = [int(root_token)], [-1], [0], [0.0]
    heap: List[Tuple[float, int, int, int, int, float]] = []
    counter = 0
    if L >= 1 and budget > 1:
        heap.append((-vals[0][0], counter, 1, 0, 0, 0.0))
    while heap and len(tokens) < budget:
        neg, _, d, r, par, pscore = heapq.heappop(heap)
        score = -neg
        node = len(tokens)
        tokens.append(idx[d - 1][r])
        parents.append(par)
        depths.append(d)
        scores.append(score)
        if r + 1 < K:
            counter += 1
            heapq.heappush(heap, (-(pscore + vals[d - 1][r + 1]), counter, d, r + 1, par, pscore))
        if d < L:
            counter += 1
            heapq.heappush(heap, (-(score + vals[d][0]), counter, d + 1, 0, node, score))
    return _make(tokens, parents, depths, scores, kind or f"ddtree{budget}")


def eagle_size(depth: int, topk: int) -> int:
    """Nodes of an :func:`eagle` tree (root included) without reranking."""
    return 1 + topk + max(0, depth - 1) * topk * topk if depth >= 1 else 1


def eagle(
    root_token: int,
    expand: Callable[[DraftTree, List[int]], torch.Tensor],
    depth: int,
    topk: int,
    total_tokens: Optional[int] = None,
    kind: Optional[str] = None,
) -> DraftTree:
    """EAGLE-2-style top-k tree.

    Level 1: the ``topk`` best children of the root. Every further level:
    the ``topk`` nodes of the previous level with the highest cumulative score
    are expanded, each with its ``topk`` best children (all kept), up to
    ``depth`` levels. ``expand(tree_so_far, frontier)`` returns the drafter's
    next-token log-probabilities ``[len(frontier), V]`` after each frontier node
    (conditioned on its own path). With ``total_tokens`` the tree is reranked
    to the ``total_tokens`` best nodes (root included), as EAGLE-2 does.
    """
    if depth < 0 or topk < 1:
        raise ValueError(f"eagle: depth {depth} >= 0 and topk {topk} >= 1 required")
    tokens, parents, depths, scores = [int(root_token)], [-1], [0], [0.0]
    frontier = [0]
    for d in range(1, depth + 1):
        partial = _make(tokens, parents, depths, scores, "partial")
        lp = expand(partial, frontier).to(torch.float64)
        vals, idx = torch.topk(lp, topk, dim=-1)
        new = []
        for i, f in enumerate(frontier):
            for j in range(topk):
                new.append(len(tokens))
                tokens.append(int(idx[i, j]))
                parents.append(f)
                depths.append(d)
                scores.append(scores[f] + float(vals[i, j]))
        order = sorted(new, key=lambda n: (-scores[n], n))
        frontier = order[:topk]
    tree = _make(tokens, parents, depths, scores, kind or f"eagle{depth}x{topk}")
    if total_tokens is not None and total_tokens < len(tree):
        tree = _rerank(tree, int(total_tokens), kind or f"eagle{depth}x{topk}n{total_tokens}")
    return tree


def _rerank(tree: DraftTree, total: int, kind: str) -> DraftTree:
    """Keep the root and the ``total - 1`` best nodes (ancestor-closed)."""
    n = len(tree)
    sc, dep = tree.scores.tolist(), tree.depths.tolist()
    order = sorted(range(1, n), key=lambda i: (-sc[i], dep[i], i))
    keep = {0}
    par = tree.parents.tolist()
    for i in order:
        if len(keep) >= total:
            break
        if par[i] in keep:
            keep.add(i)
    kept = sorted(keep)
    remap = {old: new for new, old in enumerate(kept)}
    return _make(
        [int(tree.tokens[i]) for i in kept],
        [remap[par[i]] if par[i] >= 0 else -1 for i in kept],
        [dep[i] for i in kept],
        [sc[i] for i in kept],
        kind,
    )


def chain(tokens: Sequence[int], kind: str = "chain") -> DraftTree:
    """A chain (top-k 1) tree: root then one node per depth."""
    n = len(tokens)
    return _make(list(tokens), [i - 1 for i in range(n)], list(range(n)), [0.0] * n, kind)


def accept_greedy(tree: DraftTree, target) -> Tuple[List[int], int]:
    """Greedy acceptance along the tree.

    ``target`` is either the target's logits ``[N, V]`` (row ``i`` = the
    next-token distribution after node ``i``) or a callable ``i -> argmax``
    (to compute logits lazily, only along the walk). From the root, follow the
    child whose token is the target's argmax while one exists. Returns the
    accepted path (node indices, starting at the root) and the bonus token (the
    target's argmax after the path's last node).
    """
    if isinstance(target, torch.Tensor):
        am = target.argmax(dim=-1).tolist()
        argmax = am.__getitem__
    else:
        argmax = target
    ch = tree.children()
    path = [0]
    cur = 0
    while True:
        a = int(argmax(cur))
        nxt = ch[cur].get(a)
        if nxt is None:
            return path, a
        path.append(nxt)
        cur = nxt
