"""The benchmark's shape grid.

A :class:`Shape` is one verify problem: ``batch`` requests, each with ``q_len``
draft tokens arranged as a ``tree`` (a :func:`verify_attn.testing.random_parents`
kind) over a committed prefix of ``prefix`` tokens, for an MLA model (absorbed,
576/512, one latent KV head) or a GQA model (separate K and V heads).

Grids (``--grid``):

- ``quick`` (~3-4 minutes on an H200 with every baseline): every row of
  DESIGN.md §2 (both tables, MLA) as a tree, the §2 rows where SGLang's chain
  kernel ran (and one where it failed) also as a chain, DDTree-like budgets,
  and GQA (Llama-style D128, 32 query / 4 KV heads: group 8). FlexAttention is
  compiled only for the three shapes tagged ``flex`` (its compile is slow;
  ``--flex=all`` compiles it for every shape).
- ``full``: ``quick`` plus the GQA cube T {4,16,64} x prefix {1k,8k,64k} x batch
  {1,16,64} (FlexAttention on its T16 slice), more MLA head counts and DDTree
  budgets 16..1024. Likely longer than the device tool's 10-minute command
  limit: split it with ``--shapes`` or cap it with ``--time_budget_s`` (the
  JSON is rewritten after every shape, so a cut run keeps what it measured).
- ``dry``: tiny shapes for ``--dry_run`` (CPU, reference only).

``--shapes`` keeps the shapes whose name contains any of the comma-separated
substrings (case-insensitive), e.g. ``--shapes="mla B1 ,gqa B16"``.
"""

import dataclasses
from typing import Iterable, List, Optional, Sequence, Tuple

MLA_DQK = 576
MLA_DVO = 512

GRIDS = ("quick", "full", "dry")


@dataclasses.dataclass(frozen=True)
class Shape:
    model: str            # "mla" or "gqa"
    batch: int
    heads: int            # query heads
    kv_heads: int
    d_qk: int
    d_vo: int
    q_len: int            # draft tokens per request
    prefix: int           # committed prefix per request
    tree: str             # verify_attn.testing.random_parents kind ("chain" = top-k 1)
    tags: Tuple[str, ...] = ()  # "design" (DESIGN.md §2 row), "flex", "ddtree", ...
    dtype: str = "bf16"
    # Optional ragged lengths (fixtures): overrides batch/q_len/prefix per request.
    q_lens: Optional[Tuple[int, ...]] = None
    prefix_lens: Optional[Tuple[int, ...]] = None
    label: Optional[str] = None   # overrides the generated name
    # Optional given trees (fixtures): per request, local parent ids (-1 = root).
    parents: Optional[Tuple[Tuple[int, ...], ...]] = None

    @property
    def mla(self) -> bool:
        return self.model == "mla"

    @property
    def is_chain(self) -> bool:
        return self.tree == "chain"

    def request_q_lens(self) -> List[int]:
        return list(self.q_lens) if self.q_lens is not None else [self.q_len] * self.batch

    def request_prefix_lens(self) -> List[int]:
        return list(self.prefix_lens) if self.prefix_lens is not None else [self.prefix] * self.batch

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        heads = f"H{self.heads}" if self.mla else f"H{self.heads}/{self.kv_heads} D{self.d_qk}"
        return f"{self.model} B{self.batch} {heads} T{self.q_len} L{fmt_len(self.prefix)} {self.tree}"


def fmt_len(n: int) -> str:
    """4096 -> '4k', 131072 -> '128k', 1000 -> '1000'."""
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def mla(batch, heads, q_len, prefix, tree="ddtree", tags=()) -> Shape:
    return Shape("mla", batch, heads, 1, MLA_DQK, MLA_DVO, q_len, prefix, tree, tuple(tags))


def gqa(batch, q_len, prefix, tree="ddtree", heads=32, kv_heads=4, head_dim=128, tags=()) -> Shape:
    return Shape("gqa", batch, heads, kv_heads, head_dim, head_dim, q_len, prefix, tree, tuple(tags))


K = 1024

# DESIGN.md §2, first table: (batch, heads, draft, prefix); SGLang's Triton tree
# path and its chain-only verify_shared_kv were measured on these.
DESIGN_ROWS = [
    (1, 16, 16, 4 * K),
    (1, 16, 64, 32 * K),
    (1, 128, 32, 8 * K),
    (16, 16, 64, 32 * K),
    (32, 16, 16, 4 * K),
    (4, 16, 64, 128 * K),
]
# DESIGN.md §2, second table (FlashMLA causal chain), rows not in the first.
FLASHMLA_ROWS = [
    (1, 64, 64, 32 * K),
    (128, 16, 4, 4 * K),
]


def quick_grid() -> List[Shape]:
    out = []
    for b, h, t, l in DESIGN_ROWS + FLASHMLA_ROWS:
        tags = ["design"]
        if (b, h, t, l) == (1, 16, 16, 4 * K):
            tags.append("flex")  # expected: compile failure at 576/512 (report it)
        out.append(mla(b, h, t, l, "ddtree", tags))
    # chains: where verify_shared_kv ran in §2 (1/16/16/4k, 1/128/32/8k, 32/16/16/4k)
    # and one where it failed for shared memory (1/16/64/32k)
    for b, h, t, l in [DESIGN_ROWS[0], DESIGN_ROWS[2], DESIGN_ROWS[4], DESIGN_ROWS[1]]:
        out.append(mla(b, h, t, l, "chain", ["design"]))
    # and the chains of FlashMLA's own rows (issue 8's chain target names the
    # bandwidth-bound B128 H16 T4 L4k): ours on the same causal chain it runs
    for b, h, t, l in FLASHMLA_ROWS:
        out.append(mla(b, h, t, l, "chain", ["design"]))
    # DDTree budgets (MLA, one request, 8k prefix)
    for t in (256, 1024):
        out.append(mla(1, 16, t, 8 * K, "ddtree", ["ddtree"]))
    # GQA, Llama-style D128, 32 query / 4 KV heads (group 8)
    out += [
        gqa(1, 16, 8 * K),
        gqa(16, 16, 8 * K, tags=["flex"]),      # FlexAttention measured 8.4 ms here
        gqa(1, 64, 32 * K, tags=["flex"]),      # FlexAttention failed to compile here
        gqa(64, 4, 1 * K),
        gqa(32, 16, 4 * K),
        gqa(4, 64, 64 * K),
        gqa(16, 16, 8 * K, "chain"),
        gqa(1, 256, 8 * K, tags=["ddtree"]),
    ]
    return out


def full_grid() -> List[Shape]:
    out = list(quick_grid())
    for t in (4, 16, 64):
        for l in (1 * K, 8 * K, 64 * K):
            for b in (1, 16, 64):
                out.append(gqa(b, t, l, tags=["flex"] if t == 16 else []))
    for h in (16, 64, 128):
        for b in (1, 8, 32):
            for t in (16, 64):
                for l in (4 * K, 32 * K):
                    out.append(mla(b, h, t, l))
    for t in (16, 64, 128, 512):
        out.append(mla(1, 16, t, 8 * K, "ddtree", ["ddtree"]))
    for t in (64, 1024):
        out.append(gqa(1, t, 8 * K, tags=["ddtree"]))
    # MHA (group 1): 16 and 4 rows per KV head, where a 128-row warp-role CTA
    # keeps one of its 16-row warps busy and the one-tile kernel two CTAs per SM
    # (kernels/plan.cc's head_dim 128 rule on sm_90).
    out += [gqa(16, 16, 8 * K, heads=32, kv_heads=32), gqa(64, 4, 1 * K, heads=32, kv_heads=32)]
    # head_dim 256 (Gemma-style; the one-tile kernels)
    out += [gqa(1, 64, 8 * K, head_dim=256), gqa(16, 16, 4 * K, head_dim=256),
            gqa(4, 16, 8 * K, heads=16, kv_heads=8, head_dim=256)]
    out.append(mla(1, 16, 60, 4 * K, "eagle"))   # EAGLE-2: ~60 nodes
    for b, h, t, l in DESIGN_ROWS[3:4] + DESIGN_ROWS[5:6]:
        out.append(mla(b, h, t, l, "chain", ["design"]))
    return dedupe(out)


def dry_grid() -> List[Shape]:
    """Tiny shapes for --dry_run (CPU, float64 reference in seconds)."""
    return [
        Shape("mla", 2, 4, 1, MLA_DQK, MLA_DVO, 5, 37, "ddtree", ("dry",)),
        Shape("mla", 1, 2, 1, MLA_DQK, MLA_DVO, 8, 20, "chain", ("dry",)),
        Shape("gqa", 3, 8, 2, 64, 64, 6, 50, "random", ("dry",)),
        Shape("gqa", 2, 4, 1, 128, 128, 33, 17, "ddtree", ("dry",)),
    ]


def dedupe(shapes: Iterable[Shape]) -> List[Shape]:
    seen, out = set(), []
    for s in shapes:
        if s.name in seen:
            continue
        seen.add(s.name)
        out.append(s)
    return out


def grid(name: str) -> List[Shape]:
    if name == "quick":
        return dedupe(quick_grid())
    if name == "full":
        return full_grid()
    if name == "dry":
        return dry_grid()
    raise ValueError(f"--grid: unknown grid {name!r}; expected one of {GRIDS}")


def filter_shapes(shapes: Sequence[Shape], patterns: Optional[str]) -> List[Shape]:
    """Keep shapes whose name contains any comma-separated pattern (case-insensitive)."""
    if not patterns:
        return list(shapes)
    pats = [p.strip().lower() for p in patterns.split(",") if p.strip()]
    if not pats:
        return list(shapes)
    return [s for s in shapes if any(p in s.name.lower() for p in pats)]


def wants_flex(shape: Shape, policy: str, grid_name: str) -> bool:
    """``--flex``: 'auto' (shapes tagged 'flex': 3 in the quick grid, 12 in the full
    one, to bound torch.compile time), 'all', 'none'."""
    if policy == "none":
        return False
    if policy == "all":
        return True
    if policy != "auto":
        raise ValueError(f"--flex: expected auto|all|none, got {policy!r}")
    del grid_name
    return "flex" in shape.tags
