"""FlashMLA's dense bf16 MLA decode as a chain-only baseline (``--baselines=flashmla``).

What it runs (PyPI ``sgl-flash-mla`` 1.0.0, read from the wheel's
``flash_mla/flash_mla_interface.py``): upstream FlashMLA's SM90 dense decode
kernel, kept by SGLang's fork on its "legacy" side::

    sched, _ = flash_mla.get_mla_metadata(cache_seqlens, q_len * H, 1)  # args ignored by 1.0.0:
                                                   # an empty FlashMLASchedMeta, filled by the 1st call
    out, lse = flash_mla.flash_mla_with_kvcache(
        q,              # [B, q_len, H, 576] bf16 (our [total_q, H, 576] viewed per request)
        k_cache,        # [num_blocks, 64, 1, 576] bf16 (page block 64: the only size it takes)
        block_table,    # [B, max_blocks] int32
        cache_seqlens,  # [B] int32 = prefix + q_len (the drafts are in the cache, last)
        head_dim_v=512, tile_scheduler_metadata=sched, num_splits=None,
        softmax_scale=1/sqrt(576), causal=True, use_legacy=True)
    # out [B, q_len, H, 512] bf16, lse [B, H, q_len] fp32

``use_legacy=True`` routes the call to the fork's second extension
(``_C_legacy``, op ``torch.ops.flash_mla_legacy.dense_decode_fwd``): upstream
removed dense decoding and SM90 from its current kernels, so the dense bf16
path exists only there (without ``indices`` the current side asserts).
``num_splits`` must be None in 1.0.0 (the split counts live in the
``FlashMLASchedMeta``); the first call computes the split schedule from
``cache_seqlens`` on the device and later calls reuse it (so the first call is
made in :meth:`FlashMLAChain.prepare`, as setup, like our plan step).

``causal=True`` is bottom-right aligned: query ``t`` of ``q_len`` sees KV rows
``0 .. kv_len - q_len + t``, i.e. the whole prefix and drafts ``0..t``: a
**causal chain**. FlashMLA takes no tree mask, so the column is measured for
every MLA row, tree rows included, as the chain of the same shape (same batch,
heads, q_len, prefix), and its output is checked against the float64
reference of that chain (``computes = "chain"``: the runner builds the causal
reference; it is not compared with our tree output). Dense decode runs on
SM90a only (H100/H200), with page block 64, one latent KV head, 576/512, one
q_len for every request.

Staging (the GPU machine has no network): ``VERIFY_ATTN_STAGE_FLASHMLA=1
tools/bench/fetch_baselines.sh`` puts the wheel into ``<baselines_dir>/`` (opt-in:
9.4 MiB). At first use the bench installs it with ``pip install --no-deps
--no-index --target`` into ``$TMPDIR/verify_attn_flashmla_site/<wheel>/``
(kept, keyed by the wheel's sha256, for the next run); before the staged wheel,
``$VERIFY_ATTN_FLASHMLA_SITE`` may name a folder where it is already installed,
and after it a ``flash_mla`` already on ``sys.path`` is used. It then imports
``flash_mla`` in a child process first (and, on the GPU, runs one tiny causal
decode there against a float32 reference): a torch-ABI mismatch that aborts
while loading the extension (the wheel's METADATA asks for torch>=2.14.1 while
its README says 2.10+; the H200 machine has 2.11), or a kernel that cannot run
on this driver (its cubins are built by CUDA 13.4), then costs the column
("unavailable: <reason>"), not the bench. Every reason starts with
"unavailable: "; GQA rows say "n/a" either way.
"""

import dataclasses
import glob
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import subprocess
import sys
import tempfile
from typing import Optional

import torch

from . import Impl, NotApplicable

BLOCK = 64                      # FlashMLA's page block size (TORCH_CHECK'd)
D_QK, D_V = 576, 512
WHEEL_GLOB = "sgl_flash_mla-*.whl"
SITE_ENV = "VERIFY_ATTN_FLASHMLA_SITE"
STAGE_HINT = "VERIFY_ATTN_STAGE_FLASHMLA=1 tools/bench/fetch_baselines.sh"
UNAVAILABLE = "unavailable"

_LOADED = {}


class Unavailable(Exception):
    """FlashMLA cannot run in this process; the message is the column's reason."""


def find_wheel(baselines_dir: Optional[str]) -> Optional[str]:
    """The staged ``sgl_flash_mla-*.whl`` in ``baselines_dir`` (the newest name), or None."""
    if not baselines_dir:
        return None
    found = sorted(glob.glob(os.path.join(baselines_dir, WHEEL_GLOB)))
    return found[-1] if found else None


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def install(wheel: str, root: Optional[str] = None) -> str:
    """``pip install --no-deps --no-index --target`` of ``wheel``; returns the site folder.

    Skipped when the folder already holds this wheel (same sha256). Raises
    :class:`Unavailable` with pip's last line on failure.
    """
    root = root or os.path.join(tempfile.gettempdir(), "verify_attn_flashmla_site")
    stem = os.path.basename(wheel)[: -len(".whl")]
    site = os.path.join(root, stem)
    stamp = os.path.join(site, ".verify_attn_wheel_sha256")
    digest = _sha256(wheel)
    if os.path.isfile(stamp) and open(stamp).read().strip() == digest \
            and os.path.isfile(os.path.join(site, "flash_mla", "__init__.py")):
        return site
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=stem + ".", dir=root)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
           "--no-index", "--no-compile", "--target", tmp, wheel]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        lines = [l for l in (r.stderr + r.stdout).strip().splitlines() if l.strip()]
        raise Unavailable(f"pip install --target of {os.path.basename(wheel)} failed: "
                          f"{lines[-1] if lines else 'exit status %d' % r.returncode}")
    with open(os.path.join(tmp, ".verify_attn_wheel_sha256"), "w") as f:
        f.write(digest + "\n")
    if os.path.isdir(site):
        import shutil

        shutil.rmtree(site, ignore_errors=True)
    os.replace(tmp, site)
    return site


# Run in a child process: import flash_mla from the site (loading its two
# torch extensions), and on an SM90 device one small causal dense decode
# against a float32 reference of the same chain.
PROBE = r"""
import sys
sys.path.insert(0, sys.argv[1])
import torch
try:
    import flash_mla
except Exception as e:  # the dlopen error is the cause of torch's "Could not load this library"
    msgs = []
    while e is not None and len(msgs) < 4:
        msgs.append(f"{type(e).__name__}: {e}".replace("\n", " "))
        e = e.__cause__ or e.__context__
    print("IMPORTERR", " <- ".join(msgs)[:400])
    sys.exit(3)
print("FILE", flash_mla.__file__)
print("VERSION", getattr(flash_mla, "__version__", "?"))
if not flash_mla.has_legacy():
    try:
        from flash_mla import _loader
        why = getattr(_loader, "_LEGACY_UNAVAILABLE", None) or "?"
    except Exception:
        why = "?"
    print("NOLEGACY", str(why).replace("\n", " "))
    sys.exit(0)
if sys.argv[2] != "1":
    sys.exit(0)
torch.manual_seed(0)
dev = "cuda"
B, T, H, L = 2, 5, 16, 100
kv = L + T
nb = (kv + 63) // 64
q = torch.randn(B, T, H, 576, device=dev, dtype=torch.bfloat16)
k = torch.randn(B * nb, 64, 1, 576, device=dev, dtype=torch.bfloat16)
bt = torch.arange(B * nb, device=dev, dtype=torch.int32).flip(0).view(B, nb).contiguous()
sl = torch.full((B,), kv, device=dev, dtype=torch.int32)
sched, _ = flash_mla.get_mla_metadata(sl, T * H, 1)
out, lse = flash_mla.flash_mla_with_kvcache(q, k, bt, sl, head_dim_v=512, tile_scheduler_metadata=sched,
                                            num_splits=None, softmax_scale=576 ** -0.5, causal=True,
                                            use_legacy=True)
torch.cuda.synchronize()
worst = 0.0
for b in range(B):
    kb = k[bt[b].long()].reshape(-1, 576)[:kv].float()
    s = torch.einsum("thd,kd->thk", q[b].float(), kb) * 576 ** -0.5
    vis = torch.arange(kv, device=dev)[None, :] <= (L + torch.arange(T, device=dev))[:, None]
    s = s.masked_fill(~vis[:, None, :], float("-inf"))
    ref = torch.einsum("thk,kd->thd", torch.softmax(s, -1), kb[:, :512])
    worst = max(worst, float((out[b].float() - ref).norm() / ref.norm()))
print("ERR", worst)
"""


def probe(site: str, run_kernel: bool, timeout_s: float = 300.0) -> Optional[str]:
    """None when ``flash_mla`` imports from ``site`` (and, with ``run_kernel``, a tiny decode is
    right); else the reason, one line."""
    r = subprocess.run([sys.executable, "-c", PROBE, site, "1" if run_kernel else "0"],
                       capture_output=True, text=True, timeout=timeout_s)
    out = r.stdout
    tail = [l for l in (r.stderr or "").strip().splitlines() if l.strip()]
    last = tail[-1].strip() if tail else ""
    for line in out.splitlines():
        if line.startswith("IMPORTERR"):
            return f"import flash_mla failed: {line[10:].strip()}"
    if r.returncode != 0:
        how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit status {r.returncode}"
        stage = "import flash_mla" if "FILE " not in out else "probe decode"
        return f"{stage} failed in a child process ({how}): {last[:200]}"
    file_line = [l for l in out.splitlines() if l.startswith("FILE ")]
    if not file_line or not os.path.abspath(file_line[0][5:].strip()).startswith(os.path.abspath(site)):
        return f"flash_mla came from {file_line[0][5:] if file_line else '?'}, not from {site}"
    for line in out.splitlines():
        if line.startswith("NOLEGACY"):
            return f"FlashMLA's legacy extension (dense decode, SM90) did not load: {line[9:].strip()}"
        if line.startswith("ERR"):
            err = float(line.split()[1])
            if not err < 2e-2:
                return f"probe decode wrong: relative error {err:.2e} against a float32 causal reference"
    return None


def locate(baselines_dir: Optional[str]):
    """``(site, wheel)``: where ``flash_mla`` is installed, else the staged wheel to install.

    In this order: ``$VERIFY_ATTN_FLASHMLA_SITE`` (a folder with it installed), the
    wheel staged in ``baselines_dir``, a ``flash_mla`` already on ``sys.path`` (found,
    not imported). ``(None, None)`` when there is none of them.
    """
    site = os.environ.get(SITE_ENV)
    if site:
        return site, None
    wheel = find_wheel(baselines_dir)
    if wheel:
        return None, wheel
    try:
        spec = importlib.util.find_spec("flash_mla")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        return os.path.dirname(os.path.dirname(os.path.abspath(spec.origin))), None
    return None, None


def load(baselines_dir: Optional[str], run_kernel: bool = True):
    """Install (if needed), probe in a child process, then import ``flash_mla``.

    Raises :class:`Unavailable` with the reason.
    """
    key = (os.path.abspath(baselines_dir) if baselines_dir else None, os.environ.get(SITE_ENV))
    if key in _LOADED:
        mod, why = _LOADED[key]
        if why:
            raise Unavailable(why)
        return mod
    try:
        site, wheel = locate(baselines_dir)
        if site is None and wheel is None:
            raise Unavailable(f"not staged: no {WHEEL_GLOB} in {baselines_dir} (run {STAGE_HINT})")
        if site is None:
            site = install(wheel)
        elif not os.path.isfile(os.path.join(site, "flash_mla", "__init__.py")):
            raise Unavailable(f"{site} holds no flash_mla package")
        why = probe(site, run_kernel)
        if why:
            raise Unavailable(why)
        if site not in sys.path:
            sys.path.insert(0, site)
        mod = importlib.import_module("flash_mla")
        if not os.path.abspath(mod.__file__).startswith(os.path.abspath(site)):
            raise Unavailable(f"flash_mla was already imported from {mod.__file__}, not from {site}")
    except Unavailable as e:
        _LOADED[key] = (None, str(e))
        raise
    except Exception as e:  # noqa: BLE001 - pip missing, timeout, import error
        why = f"{type(e).__name__}: {e}".splitlines()[0][:240]
        _LOADED[key] = (None, why)
        raise Unavailable(why) from e
    _LOADED[key] = (mod, None)
    return mod


# ---------------------------------------------------------------------------
# inputs


@dataclasses.dataclass
class FlashMLAInputs:
    q: torch.Tensor              # [B, q_len, H, 576], a view of the input set's q
    k_cache: torch.Tensor        # [num_blocks, 64, 1, 576]
    block_table: torch.Tensor    # int32 [B, max_blocks]
    cache_seqlens: torch.Tensor  # int32 [B] = prefix + q_len
    shared_cache: bool           # True: k_cache is the input set's own cache (--page_size=64)


def build_inputs(case, inputs, block: int = BLOCK) -> FlashMLAInputs:
    """FlashMLA's layout of one input set, same values as every other implementation's.

    With ``case.page_size == block`` the input set's paged cache and page table are
    used as they are. Otherwise (the default page size 1) the KV rows of every
    request (prefix, then drafts) are copied into a fresh pool of ``block``-row
    pages, scattered over the pool at random (seeded by the case), with the same
    5% slack as :func:`benchlib.inputs.build_case`; rows past a request's length
    are zeros. Block-table entries past a request's last page are 0 (never read).
    """
    s = case.shape
    if not s.mla or s.kv_heads != 1 or s.d_qk != D_QK or s.d_vo != D_V:
        raise NotApplicable("MLA 576/512 with one latent head only")
    if not case.uniform_q or case.batch == 0 or case.max_q_len == 0:
        raise NotApplicable("needs one q_len (> 0) for every request")
    B, T, dev = case.batch, case.max_q_len, case.device
    q = inputs.q.view(B, T, s.heads, s.d_qk)
    seqlens = case.kv_len.to(device=dev, dtype=torch.int32).contiguous()
    pages_per = [(n + block - 1) // block for n in case.kv_lens]
    max_blocks = max(pages_per)
    if case.page_size == block:
        k_cache = inputs.k_cache
        ptr = case.kv_indptr_pages.tolist()
        ids = case.kv_indices.to(torch.int64)
        shared = True
    else:
        from ..inputs import POOL_SLACK, row_request_and_local

        need = sum(pages_per)
        num_blocks = need + max(1, int(math.ceil(need * POOL_SLACK)))
        g = torch.Generator().manual_seed(case.seed + 104729)
        ids = torch.randperm(num_blocks, generator=g)[:need].to(dev)
        ptr = [0]
        for n in pages_per:
            ptr.append(ptr[-1] + n)
        k_cache = torch.zeros((num_blocks, block, 1, s.d_qk), dtype=case.dtype, device=dev)
        req, j = row_request_and_local(case.kv_indptr_flat, case.total_kv)
        ptr_t = torch.tensor(ptr, dtype=torch.int64, device=dev)
        rows = ids[ptr_t[req] + j // block] * block + j % block
        k_cache.view(num_blocks * block, 1, s.d_qk)[rows] = inputs.k_flat
        shared = False
    ids_host = ids.to("cpu", torch.int32)
    block_table = torch.zeros((B, max_blocks), dtype=torch.int32)
    for i in range(B):
        block_table[i, : pages_per[i]] = ids_host[ptr[i]: ptr[i] + pages_per[i]]
    block_table = block_table.to(dev)
    return FlashMLAInputs(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=seqlens,
                          shared_cache=shared)


def make_call(fm, fi: FlashMLAInputs, sm_scale: float, head_dim_v: int = D_V):
    """The zero-argument call; the scheduler metadata is computed on the first call and reused."""
    B, T, H, _ = fi.q.shape
    sched, splits = fm.get_mla_metadata(fi.cache_seqlens, T * H, 1)
    kw = dict(softmax_scale=sm_scale, causal=True)
    try:
        if "use_legacy" in inspect.signature(fm.flash_mla_with_kvcache).parameters:
            kw["use_legacy"] = True
    except (TypeError, ValueError):
        kw["use_legacy"] = True

    def call():
        out, _ = fm.flash_mla_with_kvcache(fi.q, fi.k_cache, fi.block_table, fi.cache_seqlens,
                                           head_dim_v=head_dim_v, tile_scheduler_metadata=sched,
                                           num_splits=splits, **kw)
        return out.reshape(B * T, H, head_dim_v)   # a view: [B, T, H, Dv] is contiguous

    return call


class FlashMLAChain(Impl):
    """FlashMLA dense bf16 decode, ``causal=True``: the causal chain of every MLA row."""

    name = "flashmla"
    label = "FlashMLA dense decode (causal chain)"
    computes = "chain"       # the runner checks it against the chain reference of the row's shape
    na_before_unavailable = True   # GQA rows say n/a, staged or not

    def __init__(self, baselines_dir: Optional[str]):
        self.baselines_dir = baselines_dir
        self._fm = None
        self._why = None

    def unavailable(self) -> Optional[str]:
        if self._fm is None and self._why is None:
            self._why = self._check()
        return self._why

    def _check(self) -> Optional[str]:
        site, wheel = locate(self.baselines_dir)
        if site is None and wheel is None:
            return (f"{UNAVAILABLE}: not staged: no {WHEEL_GLOB} in {self.baselines_dir} "
                    f"and no flash_mla installed (run {STAGE_HINT})")
        if not torch.cuda.is_available():
            return f"{UNAVAILABLE}: needs CUDA"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) != (9, 0):
            return (f"{UNAVAILABLE}: FlashMLA's dense decode runs on SM90a only "
                    f"(H100/H200); this device is sm_{major}{minor}")
        try:
            self._fm = load(self.baselines_dir)
        except Unavailable as e:
            return f"{UNAVAILABLE}: {e}"
        return None

    def applies(self, case) -> Optional[str]:
        s = case.shape
        if not s.mla:
            return "MLA only (FlashMLA: 576/512, one latent KV head)"
        if s.kv_heads != 1 or s.d_qk != D_QK or s.d_vo != D_V:
            return "MLA 576/512 with one latent head only"
        if not case.uniform_q:
            return "needs one q_len for every request"
        return None

    def describe(self) -> str:
        v = getattr(self._fm, "__version__", None)
        return f"{self.label} (sgl-flash-mla {v})" if v else self.label

    def prepare(self, case, inputs):
        fi = build_inputs(case, inputs)
        call = make_call(self._fm, fi, case.sm_scale)
        call()   # computes and keeps the split schedule (setup, not timed)
        return call
