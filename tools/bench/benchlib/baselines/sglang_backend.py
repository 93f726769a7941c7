"""SGLang's attention backends themselves: ``forward_extend`` in target verify.

Two rows per shape (``--baselines=sglang_backend``), so the cost of the
integration is visible next to the bare kernels:

- "SGLang backend: verify_attn" (``sglang_backend_ours``): our plugin backend
  (``integration/sglang/verify_attn_sglang``, ``VerifyAttnBackend``), which
  builds its metadata (prefix + draft slots, the compact tree mask converted
  from the QLEN_ONLY verify mask) in ``init_forward_metadata`` and calls
  ``verify_attn.tree_attention_paged`` from ``forward_extend``;
- "SGLang backend: triton" (``sglang_backend_triton``): SGLang 0.5.23's
  ``TritonAttnBackend`` (``extend_attention_fwd`` with the FULL tree mask).

Per shape, for each of the two backends, the SGLang objects are built once,
the way ``integration/sglang/tests/test_backend_gpu.py`` builds them through
SGLang's attention unit-test kit (``sglang/test/kits/attention_unittest``): the
kit's model-runner stand-in (``MockMLAModelRunner`` / ``MockModelRunner``, page
size 1, its ``ReqToTokenPool`` and MLA / MHA token pool), the backend from
``ATTENTION_BACKENDS``, a ``RadixAttention`` layer, a ``ForwardBatch`` in
``TARGET_VERIFY`` (bound to its own KV plan, seq_lens = the committed prefix)
with an ``EagleVerifyInput`` carrying the draft tree: SGLang's FULL mask for
Triton, the QLEN_ONLY mask written into our backend's own ``verify_mask``
buffer (as EAGLE's tree builder does) for ours. Differences from the kit, for
speed and memory: ``req_to_token`` is filled with one vectorized write (the
bench case's scattered slots: prefix, then drafts), and the token pool's
buffer is the bench input set's cache itself (``k_slots``/``v_slots``,
swapped in before every call), so nothing is copied, the rotation over input
sets works, and the outputs are checked against the same float64 reference.

``init_forward_metadata(batch)`` runs once per input set in ``prepare``,
outside the timed region (the metadata does not depend on the values). The
timed call is ``backend.forward_extend(q, k, v, layer, batch,
save_kv_cache=False)`` with the drafts' K/V passed contiguously (Triton reads
them from ``k``/``v``; ours reads them back from the cache, where the bench
also put them); no CUDA graph (``graphable = False``): eager calls, so the
Python of ``forward_extend`` is part of the time when the GPU waits for it.
``save_kv_cache=False`` leaves out the drafts' cache write, which both
backends do identically in a server.

Availability: SGLang must be importable. ``--sglang_site=PATH`` (default
``$VERIFY_ATTN_SGLANG_SITE``) names a folder where SGLang's Python files and
the staged wheels are installed (``integration/sglang/run_gpu_bench.sh`` makes
``/tmp/va_sglang_site`` from ``.gpu_stage/sglang``); it goes first on
``sys.path``, ``integration/sglang`` (the plugin package) and the test
stand-ins (``integration/sglang/tests/stubs``: ``sgl_kernel``) last. Without a
site, an SGLang already on ``sys.path`` is used. Otherwise the columns say
"not staged (...)". The bench's :mod:`.sglang_triton` loader installs its own
``sglang`` package object (staged kernel files only); it is taken out of
``sys.modules`` before the real SGLang is imported (the modules it loaded keep
working), so ``tools/bench/bench.py`` puts these two adapters after every other one.
"""

import importlib
import importlib.machinery
import os
import sys
import types
from typing import Optional

from . import Impl, NotApplicable, short_reason

_HERE = os.path.dirname(os.path.realpath(__file__))
# _HERE is <repo>/tools/bench/benchlib/baselines
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(_HERE))))
PLUGIN_DIR = os.path.join(REPO, "integration", "sglang")
STUBS_DIR = os.path.join(PLUGIN_DIR, "tests", "stubs")
SITE_ENV = "VERIFY_ATTN_SGLANG_SITE"
NOT_STAGED = ("not staged (run integration/sglang/stage.sh and integration/sglang/run_gpu_bench.sh, "
              f"or pass --sglang_site=<installed SGLang site> / set ${SITE_ENV})")
HIDDEN_SIZE = 256  # the kit's model-config field; nothing here reads it
TREE_TOPK = 4      # EagleVerifyInput.topk for trees (only "== 1" matters: chains)

_LOADED = {}


def default_site() -> Optional[str]:
    return os.environ.get(SITE_ENV) or None


def _sglang_on_path() -> bool:
    """A real SGLang on sys.path (not the bench's staged-kernels package object)."""
    try:
        return importlib.machinery.PathFinder.find_spec("sglang") is not None
    except Exception:  # noqa: BLE001
        return False


def resolve_site(site: Optional[str]):
    """``(site_or_empty_string, None)`` when SGLang can be imported, else ``(None, reason)``.

    ``""`` means "no site given, SGLang already on sys.path".
    """
    if site:
        p = os.path.abspath(os.path.expanduser(site))
        if not os.path.isdir(p):
            return None, f"{NOT_STAGED}: no folder {p}"
        if not os.path.isfile(os.path.join(p, "sglang", "__init__.py")):
            return None, (f"{NOT_STAGED}: {p} holds no installed SGLang (sglang/__init__.py); "
                          "run_gpu_bench.sh installs .gpu_stage/sglang/sglang.zip and its wheels into a site")
        return p, None
    if _sglang_on_path():
        return "", None
    return None, f"{NOT_STAGED}: no site given and SGLang is not importable"


def _purge_bench_sglang() -> None:
    """Drop the bench's own ``sglang`` package object (sglang_triton.load) from sys.modules."""
    pkg = sys.modules.get("sglang")
    if pkg is not None and getattr(pkg, "__verify_attn_bench__", False):
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            sys.modules.pop(name, None)


def _import_sglang(site: str) -> types.SimpleNamespace:
    if site and site not in sys.path:
        sys.path.insert(0, site)
    # Appended: an installed package of the same name (the plugin inside the
    # verify_attn wheel, a real sgl_kernel) wins over these, as in run_gpu_tests.sh.
    for p in (PLUGIN_DIR, os.path.join(STUBS_DIR, "common"), os.path.join(STUBS_DIR, "gpu")):
        if os.path.isdir(p) and p not in sys.path:
            sys.path.append(p)
    _purge_bench_sglang()
    importlib.invalidate_caches()
    sglang = importlib.import_module("sglang")
    where = os.path.realpath(getattr(sglang, "__file__", None) or "?")
    if site and not where.startswith(os.path.realpath(site) + os.sep):
        raise ImportError(f"sglang came from {where}, not from {site}")
    vas = importlib.import_module("verify_attn_sglang")
    vas.register()
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import (ForwardContext, forward_context,
                                                           set_forward_context)
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    # the order of test_backend_gpu.py (each kit module enters a parallel override at import)
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention as dense
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention as mla
    from verify_attn_sglang.backend import VerifyAttnBackend

    return types.SimpleNamespace(
        ATTENTION_BACKENDS=ATTENTION_BACKENDS, RadixAttention=RadixAttention,
        CaptureHiddenMode=CaptureHiddenMode, ForwardBatch=ForwardBatch, ForwardMode=ForwardMode,
        ForwardContext=ForwardContext, forward_context=forward_context,
        set_forward_context=set_forward_context, EagleVerifyInput=EagleVerifyInput,
        dense=dense, mla=mla, VerifyAttnBackend=VerifyAttnBackend,
        sglang_file=where, plugin_file=os.path.realpath(vas.__file__))


def load(site: str):
    """Import SGLang, the plugin and the kit once per process: ``(namespace, None)`` or ``(None, reason)``."""
    key = site or ""
    if key not in _LOADED:
        try:
            _LOADED[key] = (_import_sglang(site), None)
        except Exception as e:  # noqa: BLE001
            _LOADED[key] = (None, f"import failed: {short_reason(e, 300)}")
    return _LOADED[key]


class _Setup:
    """One backend's SGLang objects for one bench case (built once, reused by every input set)."""

    def __init__(self, m, backend_name: str, case):
        import torch

        from .. import inputs as inputs_mod

        s = case.shape
        bs, n = case.batch, case.max_q_len
        dev = str(case.device)
        prefix = [int(x) for x in case.prefix_lens]
        # req_to_token row width; the kit sizes its token pool from it too
        width = max(case.max_kv_len, -(-(case.num_slots + 2) // max(bs, 1)))
        fm = m.ForwardMode.TARGET_VERIFY
        name = f"va_bench_{s.model}_{backend_name}"
        if s.mla:
            if s.kv_heads != 1 or s.d_qk <= s.d_vo:
                raise NotApplicable(f"MLA dims {s.d_qk}/{s.d_vo} with {s.kv_heads} KV heads")
            kcase = m.mla.MLAAttentionCase(name=name, backend=backend_name, forward_mode=fm, num_heads=s.heads,
                                           page_size=1, prefix_lens=tuple(prefix), extend_lens=(n,) * bs)
            cfg = m.mla.TinyMLAModelConfig(num_heads=s.heads, kv_lora_rank=s.d_vo,
                                           qk_rope_head_dim=s.d_qk - s.d_vo, hidden_size=HIDDEN_SIZE,
                                           context_len=width)
            runner = m.mla.MockMLAModelRunner(case=kcase, model_config=cfg, dtype=case.dtype, device=dev,
                                              max_context_len=width, kv_lora_rank=s.d_vo,
                                              qk_rope_head_dim=s.d_qk - s.d_vo)
            layer_args = dict(num_heads=s.heads, head_dim=s.d_qk, scaling=case.sm_scale, num_kv_heads=1,
                              v_head_dim=s.d_vo)
        else:
            if s.d_qk != s.d_vo:
                raise NotApplicable(f"head dims {s.d_qk}/{s.d_vo} (the kit's dense model has one head dim)")
            kcase = m.dense.DenseAttentionCase(name=name, backend=backend_name, forward_mode=fm, num_heads=s.heads,
                                               num_kv_heads=s.kv_heads, page_size=1, prefix_lens=tuple(prefix),
                                               extend_lens=(n,) * bs)
            cfg = m.dense.TinyModelConfig(num_heads=s.heads, num_kv_heads=s.kv_heads, head_dim=s.d_qk,
                                          hidden_size=HIDDEN_SIZE, context_len=width)
            runner = m.dense.MockModelRunner(case=kcase, model_config=cfg, dtype=case.dtype, device=dev,
                                             max_context_len=width, head_dim=s.d_qk)
            layer_args = dict(num_heads=s.heads, head_dim=s.d_qk, scaling=case.sm_scale, num_kv_heads=s.kv_heads)
        layer = m.RadixAttention(layer_id=0, **layer_args)
        backend = m.ATTENTION_BACKENDS[backend_name](runner)
        if backend_name == "verify_attn":
            if not isinstance(backend, m.VerifyAttnBackend):
                raise RuntimeError(f"ATTENTION_BACKENDS['verify_attn'] built a {type(backend).__name__}")
            if not backend.va_enabled:
                raise NotApplicable(f"our backend would run SGLang's Triton kernels here ({backend.va_reason})")

        pool = runner.token_to_kv_pool
        k0 = pool.get_key_buffer(0)
        want = (s.kv_heads, s.d_qk)
        if k0.dim() != 3 or tuple(k0.shape[1:]) != want:
            raise RuntimeError(f"token pool key buffer {tuple(k0.shape)}: expected [slots, {want[0]}, {want[1]}]")

        # req_to_token: every request's slots, prefix then drafts (SGLang has
        # written out_cache_loc there before verify runs).
        r2t = runner.req_to_token_pool.req_to_token
        req, j = inputs_mod.row_request_and_local(case.kv_indptr_flat, case.total_kv)
        r2t[req.to(r2t.device), j.to(r2t.device)] = case.token_slots.to(device=r2t.device, dtype=r2t.dtype)

        # The ForwardBatch as the kit's _make_forward_batch builds it (seq_lens =
        # prefix + drafts, its own KV plan, the extend fields), then
        # _prepare_target_verify_batch (seq_lens = the committed prefix).
        qreq, qpos = inputs_mod.row_request_and_local(case.qo_indptr, case.total_q)
        pre64 = torch.tensor(prefix, dtype=torch.int64, device=dev)
        seq_full = [p + n for p in prefix]
        batch = m.ForwardBatch(
            forward_mode=fm, batch_size=bs,
            input_ids=torch.arange(case.total_q, dtype=torch.int64, device=dev),
            req_pool_indices=torch.arange(bs, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_full, dtype=torch.int32, device=dev),
            seq_lens_cpu=torch.tensor(seq_full, dtype=torch.int32, device="cpu"),
            out_cache_loc=case.draft_slots.to(device=dev, dtype=torch.int64).contiguous(),
            seq_lens_sum=sum(seq_full),
            positions=(pre64[qreq.to(dev)] + qpos.to(dev)).contiguous(),
        )
        runner.kv_index_translator.bind_own_plan(batch)
        ext = torch.full((bs,), n, dtype=torch.int32, device=dev)
        batch.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=dev)
        batch.extend_prefix_lens_cpu = list(prefix)
        batch.extend_seq_lens = ext
        batch.extend_seq_lens_cpu = [n] * bs
        batch.extend_start_loc = torch.zeros_like(ext)
        if bs > 1:
            batch.extend_start_loc[1:] = torch.cumsum(ext[:-1], dim=0)
        batch.extend_num_tokens = case.total_q
        batch.seq_lens = torch.tensor(prefix, dtype=torch.int32, device=dev)
        batch.seq_lens_cpu = torch.tensor(prefix, dtype=torch.int32, device="cpu")
        batch.seq_lens_sum = sum(prefix)

        if backend_name == "verify_attn":
            from verify_attn import masks as va_masks

            vm = backend.verify_mask
            if vm is None or vm.mode.name != "QLEN_ONLY":
                raise RuntimeError(f"our backend's verify mask is {getattr(vm, 'mode', None)}, not QLEN_ONLY")
            qlen = va_masks._unpack_words(case.tree_mask)[:, :n].reshape(-1).to(vm.buffer.device)
            if qlen.numel() > vm.buffer.numel():
                raise RuntimeError(f"QLEN_ONLY mask of {qlen.numel()} > verify_mask buffer {vm.buffer.numel()}")
            vm.buffer.fill_(True)
            vm.buffer[: qlen.numel()].copy_(qlen)
            custom_mask = vm.buffer
        else:
            custom_mask, _ = case.full_mask()
        ri = torch.arange(n, dtype=torch.long, device=dev).repeat(bs, 1)
        batch.spec_info = m.EagleVerifyInput(
            draft_token=batch.input_ids, custom_mask=custom_mask, positions=batch.positions,
            retrieve_index=ri, retrieve_next_token=torch.full_like(ri, -1),
            retrieve_next_sibling=torch.full_like(ri, -1),
            retrieve_cum_len=torch.arange(bs + 1, dtype=torch.int32, device=dev) * n,
            spec_steps=max(0, n - 1), topk=1 if s.is_chain else TREE_TOPK, draft_token_num=n,
            capture_hidden_mode=m.CaptureHiddenMode.FULL, seq_lens_sum=batch.seq_lens_sum,
            seq_lens_cpu=batch.seq_lens_cpu)

        self.m, self.case, self.runner, self.pool, self.backend = m, case, runner, pool, backend
        self.layer, self.batch, self.layer_args = layer, batch, layer_args
        self.mla = s.mla
        self.ctx = m.ForwardContext(attn_backend=backend)

    def bind(self, inputs) -> None:
        """Make the token pool's buffer this input set's cache (no copy)."""
        if self.mla:
            self.pool.kv_buffer = [inputs.k_slots]
        else:
            self.pool.k_buffer = [inputs.k_slots]
            self.pool.v_buffer = [inputs.v_slots]

    def init_metadata(self, inputs) -> None:
        import torch

        self.bind(inputs)
        with torch.no_grad(), self.m.forward_context(self.ctx):
            self.backend.init_forward_metadata(self.batch)

    def call(self, inputs):
        s = self.case.shape
        T = self.case.total_q
        q = inputs.q.reshape(T, s.heads * s.d_qk)
        k, v = inputs.k_ext, inputs.v_ext
        layer, batch, ctx = self.layer, self.batch, self.ctx
        fwd = self.backend.forward_extend
        set_ctx = self.m.set_forward_context
        pool = self.pool
        if self.mla:
            kv = [inputs.k_slots]

            def bind():
                pool.kv_buffer = kv
        else:
            kb, vb = [inputs.k_slots], [inputs.v_slots]

            def bind():
                pool.k_buffer = kb
                pool.v_buffer = vb

        H, dvo = s.heads, s.d_vo

        def run():
            bind()
            prev = set_ctx(ctx)
            try:
                o = fwd(q, k, v, layer, batch, save_kv_cache=False)
            finally:
                set_ctx(prev)
            return o.view(T, H, dvo)

        return run


class _SGLangBackendBase(Impl):
    backend_name = "?"
    competitor = False     # compared with each other and with ours_paged in the report, not as a speedup
    graphable = False      # eager only (the CUDA-graph path of the backends is not exercised here)
    check_vs_ours = True

    def __init__(self, site: Optional[str] = None):
        self.site = site if site is not None else default_site()
        self._setup = None
        self._setup_key = None

    def _mods(self):
        site, why = resolve_site(self.site)
        if why:
            return None, why
        return load(site)

    def unavailable(self) -> Optional[str]:
        _, why = resolve_site(self.site)
        if why:
            return why
        import torch

        if not torch.cuda.is_available():
            return "needs CUDA (SGLang's backends and Triton)"
        _, why = self._mods()
        return why

    def applies(self, case) -> Optional[str]:
        if not case.uniform_q:
            return "target verify needs one q_len for every request"
        if case.max_q_len < 1:
            return "no draft tokens"
        if not str(case.device).startswith("cuda"):
            return "needs CUDA"
        return None

    def describe(self) -> str:
        site, why = resolve_site(self.site)
        m = None if why else _LOADED.get(site or "", (None, None))[0]
        if m is None:
            return self.label
        return f"{self.label} (sglang {m.sglang_file}, plugin {m.plugin_file})"

    def _get_setup(self, case) -> _Setup:
        if self._setup is None or self._setup_key is not case:
            self._setup = None
            m, why = self._mods()
            if m is None:
                raise RuntimeError(why)
            self._setup = _Setup(m, self.backend_name, case)
            self._setup_key = case
        return self._setup

    def prepare(self, case, inputs):
        st = self._get_setup(case)
        st.init_metadata(inputs)   # once per input set, outside the timed region
        return st.call(inputs)

    def release(self) -> None:
        self._setup = None
        self._setup_key = None


class SGLangBackendOurs(_SGLangBackendBase):
    """Our plugin backend (``VerifyAttnBackend``): ``forward_extend`` in target verify."""

    name = "sglang_backend_ours"
    label = "SGLang backend: verify_attn"
    backend_name = "verify_attn"


class SGLangBackendTriton(_SGLangBackendBase):
    """SGLang's ``TritonAttnBackend``: ``forward_extend`` in target verify (FULL mask)."""

    name = "sglang_backend_triton"
    label = "SGLang backend: triton"
    backend_name = "triton"


def adapters(site: Optional[str] = None):
    """Both rows of ``--baselines=sglang_backend``: ours first, then Triton."""
    return [SGLangBackendOurs(site), SGLangBackendTriton(site)]
