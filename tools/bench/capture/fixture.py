"""The real-input fixture: one safetensors file with a JSON description.

Written by ``tools/bench/capture/capture.py``; read by :func:`load_fixture`, which
returns one :class:`Case` per (layer, tree kind): a batch of requests (one per
captured text position) laid into a paged KV cache with scattered pages, with
everything ``verify_attn.tree_attention_paged`` needs and the float64
reference (stored as float32) computed from the same bf16 values.

File layout (all names flat; the JSON description is the safetensors
``__metadata__["verify_attn.fixture"]`` entry, and also a ``.json`` sidecar):

* ``prefix.L{layer}.P{i}.k`` / ``.v``: bf16 ``[prefix_len_i, Hkv, D]``, the
  committed prefix KV of position ``i`` (shared by every tree kind).
* ``tree.{kind}.{tokens,parents,depths,positions}``: int32 ``[total_q]``,
  the trees of all positions concatenated (``parents`` local, -1 = root),
  ``tree.{kind}.qo_indptr`` int32 ``[B + 1]``, ``tree.{kind}.tree_mask``
  int32 ``[total_q, W]`` (verify_attn.masks.from_parents),
  ``tree.{kind}.{kv_indptr,kv_indices,kv_len}`` int32: the page table of the
  stored page size (pages scattered by a seeded random permutation).
* ``case.L{layer}.{kind}.{q,draft_k,draft_v}``: bf16 ``[total_q, H, D]`` /
  ``[total_q, Hkv, D]`` (q and k after RoPE at the nodes' positions), and
  ``case.L{layer}.{kind}.{ref_out,ref_lse}``: float32 ``[total_q, H, D]`` /
  ``[total_q, H]``, the float64 reference (natural-log lse) of the paged
  problem.

The safetensors format is written and read here directly (an 8-byte header
length, a JSON header, raw little-endian data), so neither the capture tool nor
the GPU test needs the ``safetensors`` package; the file is a standard one.
"""

import json
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

__all__ = ["Case", "save_safetensors", "load_safetensors", "load_fixture", "read_description", "build_paged",
           "page_table", "compare", "run_kernel", "find_fixture", "DEFAULT_FIXTURE", "META_KEY"]

META_KEY = "verify_attn.fixture"
DEFAULT_FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real_trees.safetensors")

_DT = {
    torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
    torch.int32: "I32", torch.int64: "I64", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
_TD = {v: k for k, v in _DT.items()}


# ---------------------------------------------------------------------------
# minimal safetensors


def save_safetensors(path: str, tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> None:
    header: Dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _DT:
            raise TypeError(f"{name}: dtype {t.dtype} not supported")
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    buf = bytearray(data)
    out = {}
    for name, info in header.items():
        s, e = info["data_offsets"]
        dt = _TD[info["dtype"]]
        if e > s:
            t = torch.frombuffer(buf, dtype=torch.uint8, count=e - s, offset=s).clone()
            t = t.view(dt).reshape(info["shape"])
        else:
            t = torch.empty(info["shape"], dtype=dt)
        out[name] = t
    return out, meta


# ---------------------------------------------------------------------------
# paged layout


def page_table(kv_lens: List[int], page_size: int, slack: float = 0.25, seed: int = 0):
    """Scattered page table: every request gets ``ceil(kv_len / page_size)`` pages
    drawn from a random permutation of a pool with ``slack`` extra pages.
    Returns ``(kv_indptr, kv_indices, num_pages)`` (int32 tensors, int)."""
    need = [(int(n) + page_size - 1) // page_size for n in kv_lens]
    total = sum(need)
    num_pages = total + max(1, int(math.ceil(total * slack)))
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(num_pages, generator=g)[:total].to(torch.int32)
    indptr = torch.zeros(len(need) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(need, dtype=torch.int64), 0).to(torch.int32)
    return indptr, perm.contiguous(), num_pages


def build_paged(rows: List[torch.Tensor], kv_indptr: torch.Tensor, kv_indices: torch.Tensor, num_pages: int,
                page_size: int, fill_seed: int = 0) -> torch.Tensor:
    """Scatter each request's KV rows ``rows[i] [kv_len_i, Hkv, D]`` into a
    ``[num_pages, page_size, Hkv, D]`` cache; every other slot holds finite
    garbage (seeded normal values of the rows' scale), as a reused cache does."""
    Hkv, D = rows[0].shape[1:]
    dtype = rows[0].dtype
    g = torch.Generator().manual_seed(int(fill_seed))
    scale = max(float(torch.cat([r.float().flatten() for r in rows]).std()), 1e-3)
    cache = (torch.randn((num_pages, page_size, Hkv, D), generator=g) * scale).to(dtype)
    flat = cache.view(num_pages * page_size, Hkv, D)
    ind = kv_indptr.tolist()
    idx = kv_indices.to(torch.int64)
    for i, r in enumerate(rows):
        n = r.shape[0]
        j = torch.arange(n)
        pages = idx[ind[i] + j // page_size]
        flat[pages * page_size + j % page_size] = r
    return cache


# ---------------------------------------------------------------------------
# cases


@dataclass
class Case:
    name: str  # "L{layer}.{kind}"
    layer: int
    kind: str  # "ddtree16", "ddtree64", "ddtree256", "eagle5x4"
    q: torch.Tensor  # bf16 [total_q, H, D]
    k_cache: torch.Tensor  # bf16 [num_pages, page_size, Hkv, D]
    v_cache: torch.Tensor
    qo_indptr: torch.Tensor  # int32 [B + 1]
    kv_indptr: torch.Tensor  # int32 [B + 1] (pages)
    kv_indices: torch.Tensor  # int32 page ids
    kv_len: torch.Tensor  # int32 [B] = prefix_len + q_len
    page_size: int
    tree_mask: torch.Tensor  # int32 [total_q, W]
    sm_scale: float
    ref_out: torch.Tensor  # float32 [total_q, H, D] (float64 reference)
    ref_lse: torch.Tensor  # float32 [total_q, H] natural log
    prefix_lens: List[int]
    q_lens: List[int]
    parents: torch.Tensor  # int32 [total_q] local parent, -1 = root
    depths: torch.Tensor  # int32 [total_q]
    positions: torch.Tensor  # int32 [total_q] = prefix_len + depth
    tokens: torch.Tensor  # int32 [total_q]
    info: Dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.q_lens)

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens)

    @property
    def max_kv_len(self) -> int:
        return int(self.kv_len.max())

    def args(self) -> tuple:
        """Positional arguments of ``verify_attn.tree_attention_paged``."""
        return (self.q, self.k_cache, self.v_cache, self.qo_indptr, self.kv_indptr, self.kv_indices, self.kv_len)

    def kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of ``verify_attn.tree_attention_paged``."""
        return dict(page_size=self.page_size, tree_mask=self.tree_mask, sm_scale=self.sm_scale,
                    max_q_len=self.max_q_len, max_kv_len=self.max_kv_len)

    def to(self, device) -> "Case":
        d = dict(self.__dict__)
        for k, v in d.items():
            if isinstance(v, torch.Tensor):
                d[k] = v.to(device)
        return Case(**d)

    def flops(self) -> int:
        H, D = self.q.shape[1], self.q.shape[2]
        kv = self.kv_len.tolist()
        return sum(2 * H * ql * kl * 2 * D for ql, kl in zip(self.q_lens, kv))

    def kv_bytes(self) -> int:
        Hkv, D = self.k_cache.shape[2], self.k_cache.shape[3]
        return int(self.kv_len.sum()) * Hkv * D * 2 * self.k_cache.element_size()


def find_fixture() -> Optional[str]:
    """Where the fixture is: ``$VERIFY_ATTN_REAL_FIXTURE``, else
    ``$BUILD_WORKSPACE_DIRECTORY/tools/bench/capture/real_trees.safetensors`` (under
    ``bazel run``), else the file next to this module (source tree, or runfiles
    through ``//tools/bench/capture:fixture``). None when there is none."""
    p = os.environ.get("VERIFY_ATTN_REAL_FIXTURE")
    if p:
        return p if os.path.isfile(p) else None
    ws = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    in_ws = [os.path.join(ws, "tools", "bench", "capture", os.path.basename(DEFAULT_FIXTURE))] if ws else []
    cands = in_ws + [DEFAULT_FIXTURE]
    for c in cands:
        if os.path.isfile(c):
            return c
    return None


def read_description(path: str) -> Dict[str, Any]:
    _, meta = load_safetensors(path)
    return json.loads(meta[META_KEY])


def load_fixture(path: Optional[str] = None, device="cpu", page_size: Optional[int] = None,
                 seed: int = 0) -> List[Case]:
    """Load the fixture as a list of :class:`Case`.

    ``page_size``: None keeps the stored page table (page size 16); another
    value (e.g. 1: every row a gather) re-lays the same rows with a fresh
    scattered table (seeded). The reference does not depend on the layout.
    """
    path = path or DEFAULT_FIXTURE
    tensors, meta = load_safetensors(path)
    desc = json.loads(meta[META_KEY])
    prefix_lens = desc["prefix_lens"]
    cases = []
    for c in desc["cases"]:
        layer, kind = c["layer"], c["kind"]
        T = f"tree.{kind}."
        C = f"case.L{layer}.{kind}."
        qo = tensors[T + "qo_indptr"]
        q_lens = (qo[1:] - qo[:-1]).tolist()
        kv_len = tensors[T + "kv_len"]
        ks, vs = [], []
        for i, ql in enumerate(q_lens):
            s, e = int(qo[i]), int(qo[i + 1])
            ks.append(torch.cat([tensors[f"prefix.L{layer}.P{i}.k"], tensors[C + "draft_k"][s:e]], 0))
            vs.append(torch.cat([tensors[f"prefix.L{layer}.P{i}.v"], tensors[C + "draft_v"][s:e]], 0))
        if page_size is None or int(page_size) == int(desc["page_size"]):
            ps = int(desc["page_size"])
            kv_indptr, kv_indices = tensors[T + "kv_indptr"], tensors[T + "kv_indices"]
            num_pages = int(desc["num_pages"][kind])
        else:
            ps = int(page_size)
            kv_indptr, kv_indices, num_pages = page_table(kv_len.tolist(), ps, seed=seed + 7919 * ps)
        k_cache = build_paged(ks, kv_indptr, kv_indices, num_pages, ps, fill_seed=seed + 1)
        v_cache = build_paged(vs, kv_indptr, kv_indices, num_pages, ps, fill_seed=seed + 2)
        case = Case(
            name=f"L{layer}.{kind}", layer=layer, kind=kind,
            q=tensors[C + "q"], k_cache=k_cache, v_cache=v_cache,
            qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len=kv_len,
            page_size=ps, tree_mask=tensors[T + "tree_mask"], sm_scale=float(desc["sm_scale"]),
            ref_out=tensors[C + "ref_out"], ref_lse=tensors[C + "ref_lse"],
            prefix_lens=list(prefix_lens), q_lens=q_lens,
            parents=tensors[T + "parents"], depths=tensors[T + "depths"],
            positions=tensors[T + "positions"], tokens=tensors[T + "tokens"],
            info=dict(c),
        )
        cases.append(case.to(device) if str(device) != "cpu" else case)
    return cases


def compare(out: torch.Tensor, lse: Optional[torch.Tensor], case: Case) -> Dict[str, float]:
    """Errors of a kernel result against the case's reference. NaN/inf -> inf.

    ``rel_err = ||out - ref||_F / ||ref||_F`` over the whole batch, also the worst
    per-request value (``rel_err_max_req``); ``lse_abs_err`` = max |lse - ref|.
    """
    o = out.detach().to("cpu", torch.float64)
    r = case.ref_out.to("cpu", torch.float64)
    res: Dict[str, float] = {}
    if not bool(torch.isfinite(o).all()):
        res["rel_err"] = res["rel_err_max_req"] = res["max_abs_err"] = float("inf")
    else:
        res["rel_err"] = float((o - r).norm() / r.norm().clamp_min(1e-30))
        res["max_abs_err"] = float((o - r).abs().max())
        qo = case.qo_indptr.tolist()
        worst = 0.0
        for i in range(len(qo) - 1):
            a, b = qo[i], qo[i + 1]
            worst = max(worst, float((o[a:b] - r[a:b]).norm() / r[a:b].norm().clamp_min(1e-30)))
        res["rel_err_max_req"] = worst
    if lse is not None:
        l = lse.detach().to("cpu", torch.float64)
        rl = case.ref_lse.to("cpu", torch.float64)
        res["lse_abs_err"] = float((l - rl).abs().max()) if bool(torch.isfinite(l).all()) else float("inf")
    return res


def run_kernel(case: Case, **kw):
    """``verify_attn.tree_attention_paged`` on a (CUDA) case; returns ``(out, lse)``.

    Extra keywords (``num_splits``, ``out``, ``lse``) are passed through. For the
    bench: ``cases = load_fixture(path, device="cuda")``, then time
    ``run_kernel(c)`` and check ``compare(*run_kernel(c), c)["rel_err"] < 1e-2``;
    ``c.flops()`` / ``c.kv_bytes()`` give the work of one call.
    """
    import verify_attn  # noqa: PLC0415

    return verify_attn.tree_attention_paged(*case.args(), **case.kwargs(), return_lse=True, **kw)
