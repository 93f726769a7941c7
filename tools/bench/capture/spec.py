"""Drafting real trees with the model, and greedy / tree-speculative decoding.

The state of a sequence between steps (serving-engine convention, see
``trees.py``): ``cache`` holds the KV of the committed tokens except the last
one, ``root`` is that last committed token. A verify step feeds the tree (root
first) at positions ``cache.n + depth``, walks it greedily, commits the KV rows
of the accepted path (root included, in path order, so at consecutive
positions) and makes the bonus token the next root.
"""

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch

from model import CausalAttention, KVCache, Llama, TreeAttention
import trees as trees_mod
from trees import DraftTree


class Drafter:
    """Drafts from the model's own next-token distributions.

    ``num_layers=None``: the full model (self-drafting); ``num_layers=N``: an
    early-exit drafter (first N layers, then the final norm and the tied LM
    head; it shares the target's cache for those layers, as LayerSkip-style
    self-speculation does). It only ever writes cache rows past ``cache.n``.
    """

    def __init__(self, model: Llama, num_layers: Optional[int] = None, noise: float = 0.0, seed: int = 0):
        self.model = model
        self.num_layers = num_layers
        self.noise = float(noise)
        self._gen = torch.Generator().manual_seed(int(seed))

    def _logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """float64 log-probs; with ``noise > 0`` a deterministic (seeded) Gumbel
        perturbation, renormalized: an imperfect drafter whose top choices often
        differ from the target's argmax (tests use it so that acceptance walks
        side branches)."""
        lp = torch.log_softmax(logits.to(torch.float64), -1)
        if self.noise:
            u = torch.rand(lp.shape, generator=self._gen, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
            lp = torch.log_softmax(lp - self.noise * torch.log(-torch.log(u)), -1)
        return lp

    @torch.inference_mode()
    def rollout(self, cache: KVCache, root: int, depth: int) -> torch.Tensor:
        """Per-depth distributions ``[depth, V]`` (float64 log-probs) of a greedy
        rollout from ``root``: row ``d - 1`` is the drafter's distribution of
        the token at depth ``d`` (a block drafter's per-position marginals)."""
        m = self.model
        n0 = cache.n
        x = int(root)
        out = []
        try:
            for d in range(depth):
                res = m.forward(torch.tensor([x]), torch.tensor([n0 + d]), cache, CausalAttention(),
                                num_layers=self.num_layers)
                cache.append(res.new_k, res.new_v)
                lp = self._logprobs(res.logits[0])
                out.append(lp)
                x = int(lp.argmax())
        finally:
            cache.truncate(n0)
        return torch.stack(out)

    def ddtree(self, cache: KVCache, root: int, budget: int, depth: int = 16,
               depth_logprobs: Optional[torch.Tensor] = None) -> DraftTree:
        """DDTree best-first tree of ``budget`` nodes over ``depth`` per-depth
        distributions (a greedy :meth:`rollout`, or ``depth_logprobs`` if given)."""
        if depth_logprobs is None:
            depth = max(1, min(depth, budget - 1))
            depth_logprobs = self.rollout(cache, root, depth)
        return trees_mod.ddtree(root, depth_logprobs, budget)

    def eagle(self, cache: KVCache, root: int, depth: int = 5, topk: int = 4,
              total_tokens: Optional[int] = None) -> DraftTree:
        """EAGLE top-k tree; each level re-runs the partial tree with tree attention."""
        m = self.model

        def expand(partial: DraftTree, frontier: List[int]) -> torch.Tensor:
            res = m.forward(partial.tokens, partial.positions(cache.n), cache, TreeAttention(partial.parents),
                            num_layers=self.num_layers, logits_rows=torch.tensor(frontier))
            return self._logprobs(res.logits)

        return trees_mod.eagle(root, expand, depth, topk, total_tokens)


@dataclass
class DecodeResult:
    tokens: List[int]
    logits: List[torch.Tensor]  # logits[i]: the target's distribution that produced tokens[i]
    accepted: List[int] = field(default_factory=list)  # per verify step: drafts accepted
    tree_sizes: List[int] = field(default_factory=list)
    side_accepts: int = 0  # accepted nodes that have an earlier (drafter-preferred) sibling


@torch.inference_mode()
def greedy_decode(model: Llama, cache: KVCache, root: int, n_new: int) -> DecodeResult:
    """Plain greedy decoding, one token per forward (torch SDPA attention). Modifies ``cache``."""
    toks, logits = [], []
    x = int(root)
    while len(toks) < n_new:
        res = model.forward(torch.tensor([x]), torch.tensor([cache.n]), cache, CausalAttention())
        cache.append(res.new_k, res.new_v)
        lg = res.logits[0]
        x = int(lg.argmax())
        toks.append(x)
        logits.append(lg)
    return DecodeResult(toks, logits)


@torch.inference_mode()
def verify_step(model: Llama, cache: KVCache, tree: DraftTree) -> Tuple[List[int], int, torch.Tensor]:
    """One verify forward over ``tree`` with verify_attn's reference attention.

    Commits the accepted path's KV rows; returns (path, bonus, logits of the path nodes).
    """
    res = model.forward(tree.tokens, tree.positions(cache.n), cache, TreeAttention(tree.parents),
                        compute_logits=False)
    memo = {}

    def argmax(i: int) -> int:
        if i not in memo:
            memo[i] = model.lm_head(res.hidden[i])
        return int(memo[i].argmax())

    path, bonus = trees_mod.accept_greedy(tree, argmax)
    cache.append(res.new_k, res.new_v, rows=torch.tensor(path))
    return path, bonus, torch.stack([memo[i] for i in path])


@torch.inference_mode()
def tree_spec_decode(model: Llama, cache: KVCache, root: int, n_new: int,
                     build: Callable[[KVCache, int], DraftTree]) -> DecodeResult:
    """Tree speculative decoding with greedy acceptance. ``build(cache, root)``
    drafts the tree of a step. Modifies ``cache``."""
    out = DecodeResult([], [])
    x = int(root)
    while len(out.tokens) < n_new:
        tree = build(cache, x)
        path, bonus, lg = verify_step(model, cache, tree)
        emitted = [int(tree.tokens[i]) for i in path[1:]] + [bonus]
        out.tokens.extend(emitted)
        out.logits.extend(list(lg))
        out.accepted.append(len(path) - 1)
        out.tree_sizes.append(len(tree))
        first_child = {}
        for i, p in enumerate(tree.parents.tolist()):
            first_child.setdefault(p, i)
        par = tree.parents.tolist()
        out.side_accepts += sum(1 for i in path[1:] if first_child[par[i]] != i)
        x = bonus
    out.tokens = out.tokens[:n_new]
    out.logits = out.logits[:n_new]
    return out
