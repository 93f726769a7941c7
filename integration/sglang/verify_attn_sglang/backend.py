"""``VerifyAttnBackend``: SGLang's Triton backend, with target verify served by verify_attn.

It subclasses SGLang's ``TritonAttnBackend`` (0.5.23) and overrides only what
target verify needs; every other forward mode (prefill/extend, decode, draft
extend, idle, DLLM) runs the inherited Triton code unchanged.

Target verify (``ForwardMode.TARGET_VERIFY``, EAGLE/EAGLE3/NGRAM/DFlash/...):

- metadata (:meth:`init_forward_metadata` eager, :meth:`init_forward_metadata_out_graph`
  before CUDA-graph capture and replay, into buffers preallocated by
  :meth:`init_cuda_graph_state`): ``qo_indptr = arange(0, (bs+1)*N, N)``;
  per request ``kv_len = seq_len + N`` rows: the prefix slots (packed by
  SGLang's own ``kv_index_translator.pack_read_stream``, as the Triton backend
  does) followed by the draft slots ``out_cache_loc[r*N:(r+1)*N]`` (SGLang
  writes the drafts' K/V there before attention; we read them back from the
  cache), token slots (``page_size=1`` view: right for any ``--page-size``;
  with a ``--page-size`` that is a multiple of 64 the kernel gets it as the
  ``kv_slot_runs`` hint, so that on sm_90 its TMA kernel copies each 64-slot
  run of a page by bulk tensor copies and gathers only the rest);
  the compact tree mask ``int32 [bs*N, ceil(N/32)]`` converted on the GPU from
  the QLEN_ONLY mask (or from a FULL mask some producer still allocated), or
  no mask at all for chains (top-k 1 / no custom mask: ``causal=True``).
  No host sync: host bounds come from ``seq_lens_cpu`` or ``max_context_len``.
  A padded CUDA-graph replay (``num_padding > 0``: ``bs`` padded lanes of
  lengths and pool rows, but ``out_cache_loc`` and the mask of the ``raw_bs``
  real requests) runs all ``bs`` requests; the padded ones read the reserved
  slot 0 as drafts and a causal mask (their rows are discarded).
- the mask buffer: the backend exposes a QLEN_ONLY ``VerifyMask``
  (``bs * N * N`` bools) from construction on, so EAGLE's tree builder writes
  the compact layout into it and SGLang's FULL buffer (``N * (context + N)``
  bools per request) is never allocated while this backend serves verify.
  NGRAM builds its own mask and picks FULL from a module constant
  (``ngram_worker.USE_FULL_MASK``); we set that constant to False at
  construction (a runtime setting, no file is patched).
- the kernel: a ``verify_attn.TreeAttentionPlan`` per forward batch, made at its
  first layer (from the metadata of ``init_forward_metadata`` and the layer's
  heads, dims and scale) and run by every layer on SGLang's pool tensors (no
  planning per layer); eager batches write their metadata into grow-only
  buffers, so a batch of a shape seen before (requests, drafts, rounded
  max_kv_len) reuses that shape's plan and plans nothing. MLA (absorbed: q
  ``[T, H, 576]``, cache ``[slots, 1, 576]``, value = first 512) or MHA/GQA (head dim 64/128/256, group <= 16),
  fp16/bf16. A workspace a captured launch uses is kept for the life of the
  process (verify_attn.plan), whatever happens to the plan.

SGLang settings the backend makes at construction (runtime settings, no file
patched): NGRAM's mask layout (above, only when this backend runs target
verify), ``VerifyAttnBackend`` on DFlash's list of backends that verify
causally without a custom mask (:func:`register_dflash_mask_policy`), and
``needs_cpu_seq_lens`` (the scheduler keeps host lengths for it).

Configurations the kernel does not cover make the backend a plain Triton
backend (with a warning at construction): sliding-window models, decode
context parallelism, two-batch overlap, PD multiplexing, ragged target verify,
deterministic inference, DLLM, an fp8 KV cache but e4m3 for MLA and for MHA/GQA of head dim 64
or 128 (the layers' k_scale / v_scale go to each run; MLA's values take k_scale), unsupported head dims. Layer features it does not implement (logit soft-capping, attention
sinks, score_mod, xai temperature, cross attention) raise NotImplementedError
in target verify, naming the feature, rather than compute something else.
"""

import collections
import logging
from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.attention.verify_mask import VerifyMask, tree_mask_numel
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.speculative.eagle_utils import TreeMaskMode

from . import BACKEND_NAME
from . import metadata as md

logger = logging.getLogger(__name__)

MAX_DRAFT_TOKENS = 1024  # verify_attn's bound on q_len
MHA_HEAD_DIMS = (64, 128, 256)
MLA_DIMS = (576, 512)
MAX_GQA_GROUP = 16
MAX_MLA_HEADS = 128
NOT_VERIFY_BACKEND = "not the target-verify backend"
_DRAFT_NOTE_SAID = False


@dataclass
class VerifyMetadata:
    """What the captured (or eager) kernel launch reads; tensors are views of
    preallocated buffers in CUDA-graph mode."""

    bs: int
    n: int
    qo_indptr: torch.Tensor  # int32 [bs + 1]
    kv_indptr: torch.Tensor  # int32 [bs + 1]
    kv_indices: torch.Tensor  # int32 [>= sum(kv_len)]
    kv_len: torch.Tensor  # int32 [bs]
    tree_mask: Optional[torch.Tensor]  # int32 [bs * n, W] or None (causal)
    causal: bool
    max_kv_len: int
    # The verify_attn.TreeAttentionPlans of this batch, one per (heads, dims,
    # scale, dtype) of its layers, each made at the first layer of its kind and
    # run by the others; see VerifyAttnBackend._va_plan_for.
    plans: Optional[dict] = None


def _sglang_mode_reason() -> Optional[str]:
    """SGLang serving modes the backend cannot serve target verify in (None: none).

    - two-batch overlap: its child backends get slices of the primary's verify
      mask cut at FULL-layout offsets (``two_batch_overlap.split_spec_info``),
      while ours is QLEN_ONLY; its child views carry no ``num_padding``;
    - PD multiplexing: replays run on per-group backend instances, not the one
      EAGLE wrote the mask into;
    - ragged target verify (``SGLANG_RAGGED_VERIFY_MODE`` other than
      ``static``): per-request draft counts, which the uniform ``qo_indptr``
      here does not describe.
    Flags that SGLang has not published (unit tests without a server) read as off.
    """
    try:
        from sglang.srt.runtime_context import get_disagg, get_exec  # noqa: PLC0415
    except ImportError:
        get_disagg = get_exec = None

    def flag(getter, *path):
        if getter is None:
            return False
        try:
            v = getter()
            for a in path:
                v = getattr(v, a)
        except (ValueError, AttributeError, KeyError):
            return False
        return bool(v)

    if flag(get_exec, "overlap", "enable_two_batch_overlap"):
        return "two-batch overlap (--enable-two-batch-overlap)"
    if flag(get_disagg, "enable_pdmux"):
        return "PD multiplexing (--enable-pdmux)"
    try:
        from sglang.srt.environ import envs  # noqa: PLC0415

        mode = envs.SGLANG_RAGGED_VERIFY_MODE.get()
    except Exception:  # noqa: BLE001 - an SGLang without the setting: static verify
        mode = "static"
    if mode not in (None, "", "static"):
        return f"ragged target verify (SGLANG_RAGGED_VERIFY_MODE={mode})"
    return None


def _round_up_kv(rows: int) -> int:
    """``rows`` rounded up to one of 8 steps per power of two (at most 12.5% more; 256 at least)."""
    if rows <= 256:
        return 256
    step = 1 << (rows.bit_length() - 4)
    return (rows + step - 1) // step * step


def _real_batch_size(forward_batch, bs: int) -> int:
    """Requests of this verify batch that are real: a padded CUDA-graph replay's
    view says ``num_padding``; an eager batch padded for DP / MLP sync
    (``ForwardBatch._pad_inputs_to_size``) keeps ``_original_batch_size``."""
    num_padding = getattr(forward_batch, "num_padding", None)
    if num_padding is None:
        orig = getattr(forward_batch, "_original_batch_size", None)
        if orig is not None:
            num_padding = bs - orig  # real_batch_size checks it
    return md.real_batch_size(bs, num_padding)


def _fp8_run_scales(layer):
    """An fp8 (e4m3) pool's scales for one layer's run, as SGLang stores K / k_scale
    and V / v_scale (the Triton backend's set_kv_buffer; 1.0 without a scale), from
    the host floats ``k_scale_float`` / ``v_scale_float``; None when a scale tensor
    has no host value (the device tensor is never read) or a v_scale comes without
    a k_scale (the Triton backend then stores V undivided)."""
    if getattr(layer, "k_scale", None) is None and getattr(layer, "v_scale", None) is not None:
        return None
    out = []
    for t, f in ((getattr(layer, "k_scale", None), getattr(layer, "k_scale_float", None)),
                 (getattr(layer, "v_scale", None), getattr(layer, "v_scale_float", None))):
        if t is None:
            out.append(1.0)
        elif f is None:
            return None
        else:
            out.append(float(f))
    return tuple(out)


def _kv_scales(layer):
    """None when the layer's KV scales change nothing, else (k_scale, v_scale).

    The cache is fp16/bf16 here (an fp8 cache makes the backend Triton's at
    construction). Checkpoints with fp8 *weights* (DeepSeek-V3 / R1:
    ``quant_method: fp8``) still give every attention layer a ``k_scale`` /
    ``v_scale``, 1.0 unless the checkpoint holds KV scales
    (``quantization/kv_cache.py``, ``process_weights_after_loading``); with 1.0
    Triton stores ``k / 1.0`` and reads it back times 1.0, which is what this
    backend does without them. Other values (K stored divided by the scale,
    read back times it) are not served. The Python floats ``k_scale_float`` /
    ``v_scale_float`` say it without reading the device tensors.
    """
    ks, vs = getattr(layer, "k_scale_float", None), getattr(layer, "v_scale_float", None)
    # Each scale: no tensor at all, or a loaded float of exactly 1.0.
    k_unit = getattr(layer, "k_scale", None) is None or ks == 1.0
    v_unit = getattr(layer, "v_scale", None) is None or vs == 1.0
    return None if k_unit and v_unit else (ks, vs)


def _verify_side_reason(model_runner) -> Optional[str]:
    """None when this backend is the one SGLang runs target verify on (or the
    runner does not say), else why not.

    With two backends (``--prefill-attention-backend`` / ``--decode-attention-backend``)
    SGLang runs target verify on the decode one under
    ``--speculative-attention-mode decode``, else on the prefill one
    (``HybridAttnBackend._select_backend``). The runner stamps the pair before
    it builds its backends (``ModelRunner.init_attention_backends``).
    """
    pre = getattr(model_runner, "prefill_attention_backend_str", None)
    dec = getattr(model_runner, "decode_attention_backend_str", None)
    if pre is None or dec is None or pre == dec:
        return None
    try:
        from sglang.srt.runtime_context import get_spec  # noqa: PLC0415

        mode = get_spec().speculative_attention_mode
    except Exception:  # noqa: BLE001 - no published config (unit tests): SGLang's default
        mode = "prefill"
    side, name = ("decode", dec) if mode == "decode" else ("prefill", pre)
    if name == BACKEND_NAME:
        return None
    return (f"{NOT_VERIFY_BACKEND}: SGLang runs target verify on the {side} backend {name!r} "
            f"(--speculative-attention-mode {mode})")


def register_dflash_mask_policy() -> None:
    """Put ``VerifyAttnBackend`` on DFlash's list of backends that serve its
    verify causally without a custom mask.

    SGLang 0.5.23 decides by the class name of the backend that runs target
    verify (``dflash_utils.resolve_dflash_verify_mask_policy``, its list
    ``_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS``, which names
    ``TritonAttnBackend``): a backend off the list gets the CUDA-graph runner's
    custom-mask buffer at capture, an all-ones mask under which a block's
    tokens see later ones. This backend (and the Triton code it inherits)
    serves a verify with no custom mask causally, as Triton does. A runtime
    setting of the module; no file is patched. Idempotent.
    """
    try:
        from sglang.srt.speculative import dflash_utils  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - DFlash not importable: nothing to register
        return
    names = getattr(dflash_utils, "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS", None)
    if names is not None and VerifyAttnBackend.__name__ not in names:
        dflash_utils._DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS = frozenset(names) | {VerifyAttnBackend.__name__}


def draft_backend_note() -> Optional[str]:
    """What the draft model runs when ``--speculative-draft-attention-backend`` is
    not given (None when it is, or without speculative decoding).

    SGLang gives a draft worker the prefill backend's name; ``verify_attn`` is
    not one of its draft backends (``DRAFT_ATTENTION_BACKEND_CHOICES``), so it
    falls back to its platform default (``flashinfer`` on CUDA) with no word at
    start-up (``draft_worker_common.resolve_draft_worker_attention_backend``).
    """
    try:
        from sglang.srt.runtime_context import get_spec  # noqa: PLC0415

        spec = get_spec()
        algo, draft = spec.speculative_algorithm, spec.speculative_draft_attention_backend
    except Exception:  # noqa: BLE001 - no published config
        return None
    if not algo or draft:
        return None
    return (f"the {algo} draft model does not run verify_attn (not one of SGLang's draft attention backends): "
            "SGLang falls back to its default (flashinfer on CUDA); pass --speculative-draft-attention-backend "
            "triton (or flashinfer, fa3) to choose it")


def _import_verify_attn():
    import verify_attn  # noqa: PLC0415

    return verify_attn


class VerifyAttnBackend(TritonAttnBackend):
    """Triton backend with TARGET_VERIFY served by verify_attn's paged tree-verify kernel."""

    # The scheduler keeps seq_lens_cpu / seq_lens_sum for this backend (with
    # overlap scheduling, by an asynchronous copy on its side stream): eager
    # target verify sizes the page table and bounds max_kv_len from them
    # instead of from bs x max_context_len.
    needs_cpu_seq_lens: bool = True

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, **kwargs):
        super().__init__(model_runner, skip_prefill=skip_prefill, kv_indptr_buf=kv_indptr_buf, **kwargs)
        register_dflash_mask_policy()
        # An fp8 (e4m3) pool: plans for an fp8 cache, each layer's scales per run.
        self._va_kv_fp8 = getattr(model_runner, "kv_cache_dtype", None) == torch.float8_e4m3fn
        self.va_reason = self._va_unsupported_reason(model_runner)
        self.va_enabled = self.va_reason is None
        self.va_metadata: Optional[VerifyMetadata] = None
        self._va_graph = None
        # Eager target verify: grow-only metadata buffers and the plans made on
        # them, reused by every later batch of the same shape (see _va_eager_plans).
        self._va_eager = None
        self._va_max_bs = model_runner.req_to_token_pool.size
        self.va_plans_made = 0  # TreeAttentionPlans made (at most one per forward batch of one model)
        self._va_layer_keys = {}  # id(layer) -> (layer, plan key): the layer's checks ran
        ps = int(getattr(self, "page_size", 1) or 1)  # TritonAttnBackend's, from the server's --page-size
        # Token slots in runs of ps from each request's first row (SGLang's pages):
        # a kernel-choice hint for verify_attn (tree_attention_paged's kv_slot_runs).
        self._va_slot_runs = ps if ps > 1 and ps % 64 == 0 else 1
        if not self.va_enabled:
            if self.va_reason.startswith(NOT_VERIFY_BACKEND):
                logger.info("verify_attn backend: %s; this one runs SGLang's Triton kernels", self.va_reason)
            elif self.va_reason != "no target verify":
                logger.warning("verify_attn backend: target verify runs SGLang's Triton kernels (%s)", self.va_reason)
            return
        global _DRAFT_NOTE_SAID
        note = None if _DRAFT_NOTE_SAID else draft_backend_note()
        if note is not None:
            _DRAFT_NOTE_SAID = True
            logger.warning("verify_attn backend: %s", note)
        _import_verify_attn()  # fail at construction, not at the first verify, if the wheel is broken
        # The compact verify mask from the start (eager mode too): EAGLE's tree
        # builder writes QLEN_ONLY into it, so no FULL buffer is ever made.
        self._verify_mask = self._va_make_verify_mask(self._va_max_bs)
        self._va_set_ngram_compact_mask()

    # ------------------------------------------------------------------ support

    def _va_unsupported_reason(self, model_runner) -> Optional[str]:
        if self.skip_prefill or getattr(model_runner, "is_draft_worker", False):
            return "no target verify"
        n = self.num_draft_tokens
        if not n:
            return "no target verify"
        side = _verify_side_reason(model_runner)
        if side is not None:
            return side
        if n > MAX_DRAFT_TOKENS:
            return f"{n} draft tokens > {MAX_DRAFT_TOKENS}"
        if self.dcp_size > 1:
            return "decode context parallelism (--dcp-size > 1)"
        mode = _sglang_mode_reason()
        if mode is not None:
            return mode
        if self.sliding_window_size is not None and self.sliding_window_size > 0:
            return "sliding-window attention"
        if self.enable_deterministic:
            return "deterministic inference"
        if getattr(self, "dllm_attention", None) is not None:
            return "DLLM"
        kv_dtype = getattr(model_runner, "kv_cache_dtype", None)
        if kv_dtype not in (torch.float16, torch.bfloat16, torch.float8_e4m3fn):
            return f"KV cache dtype {kv_dtype} (fp16/bf16, or float8_e4m3fn for MLA and MHA/GQA)"
        cfg = model_runner.model_config
        if getattr(cfg, "is_encoder_decoder", False):
            return "encoder-decoder model"
        if self.use_mla:
            d_qk = getattr(cfg, "kv_lora_rank", 0) + getattr(cfg, "qk_rope_head_dim", 0)
            if (d_qk, getattr(cfg, "kv_lora_rank", 0)) != MLA_DIMS:
                return f"MLA dims {d_qk}/{getattr(cfg, 'kv_lora_rank', None)} (576/512 only)"
            if self.num_head > MAX_MLA_HEADS:
                return f"{self.num_head} MLA heads per GPU (<= {MAX_MLA_HEADS})"
        else:
            hd = getattr(cfg, "head_dim", None)
            vd = getattr(cfg, "v_head_dim", hd)
            if hd not in MHA_HEAD_DIMS or vd != hd:
                return f"head dims {hd}/{vd} ({'/'.join(map(str, MHA_HEAD_DIMS))} with equal K and V only)"
            if self.num_kv_head < 1 or self.num_head % self.num_kv_head:
                return f"{self.num_head} heads over {self.num_kv_head} KV heads"
            if self.num_head // self.num_kv_head > MAX_GQA_GROUP:
                return f"GQA group {self.num_head // self.num_kv_head} > {MAX_GQA_GROUP}"
        return None

    def _va_make_verify_mask(self, max_bs: int) -> VerifyMask:
        mode = TreeMaskMode.QLEN_ONLY
        return VerifyMask(
            buffer=torch.zeros(
                tree_mask_numel(mode, max_bs, self.num_draft_tokens, self.max_context_len),
                dtype=torch.bool,
                device=self.device,
            ),
            mode=mode,
            max_bs=max_bs,
            is_read=True,
        )

    def _va_set_ngram_compact_mask(self) -> None:
        """NGRAM chooses its verify-mask layout from a module constant; ask it for QLEN_ONLY."""
        try:
            from sglang.srt.speculative import ngram_worker  # noqa: PLC0415
        except Exception:  # noqa: BLE001 - NGRAM not importable: nothing to switch
            return
        if getattr(ngram_worker, "USE_FULL_MASK", False):
            ngram_worker.USE_FULL_MASK = False

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None,
                              cuda_graph_num_kv_splits_buf=None):
        if not self.va_enabled:
            return super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf=kv_indices_buf,
                                                 cuda_graph_num_kv_splits_buf=cuda_graph_num_kv_splits_buf)
        saved = self.num_draft_tokens
        self.num_draft_tokens = 0  # keeps Triton's init from allocating its FULL verify mask
        try:
            super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf=kv_indices_buf,
                                          cuda_graph_num_kv_splits_buf=cuda_graph_num_kv_splits_buf)
        finally:
            self.num_draft_tokens = saved
        if self._verify_mask is None or self._verify_mask.max_bs < max_bs:
            self._verify_mask = self._va_make_verify_mask(max(max_bs, self._va_max_bs))
        self._va_alloc_graph(max_bs)

    def _va_alloc_graph(self, max_bs: int) -> None:
        n = self.num_draft_tokens
        cap = max_bs * (self.max_context_len + n) + 1  # +1: the pack's trash slot
        self._va_graph = self._va_buffers(max_bs, n, cap)

    def _va_buffers(self, max_bs: int, n: int, cap: int) -> dict:
        """Metadata buffers for up to ``max_bs`` requests of ``n`` drafts and
        ``cap`` page-table entries (the CUDA-graph ones, and eager mode's)."""
        dev = torch.device(self.device)  # SGLang passes a string ("cuda") or a torch.device
        return dict(
            max_bs=max_bs,
            n=n,
            qo_indptr=md.uniform_qo_indptr(max_bs, n, device=dev),
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            kv_len=torch.ones(max_bs, dtype=torch.int32, device=dev),
            # CPU tensors build the slots in int64 (torch's scatter); CUDA in place.
            kv_indices64=torch.zeros(cap, dtype=torch.int64, device=dev) if dev.type == "cpu" else None,
            kv_indices=torch.zeros(cap, dtype=torch.int32, device=dev),
            tree_mask=torch.zeros(max_bs * n, md.mask_words(n), dtype=torch.int32, device=dev),
            causal_rows=md.causal_rows(n, device=dev),  # a padded replay's tree rows, built once
            cap=cap,
        )

    # Eager batches reuse plans: a plan binds the metadata buffers (their
    # addresses and sizes) and host bounds (requests, drafts, max_kv_len); the
    # kernel reads everything else from the buffers, as a CUDA-graph replay does.
    # So eager mode writes each batch's metadata into grow-only buffers, rounds
    # max_kv_len up to one of 8 steps per power of two (the split-K count
    # planned for at most 12.5% more KV than the longest request), and keeps
    # the plans of the last _VA_EAGER_PLANS shapes: a verify step whose shape
    # was seen before makes no plan at all.
    _VA_EAGER_PLANS = 16

    def _va_eager_buffers(self, bs: int, n: int, cap: int) -> dict:
        e = self._va_eager
        if e is None or e["n"] != n or e["max_bs"] < bs or e["cap"] < cap:
            if e is not None and e["n"] == n:  # grow by half again, so growth reallocates rarely
                bs, cap = max(bs, e["max_bs"] * 3 // 2), max(cap, e["cap"] * 3 // 2)
            e = self._va_eager = self._va_buffers(bs, n, cap)
            e["plans"] = collections.OrderedDict()  # buffers replaced: the plans bound the old ones
        return e

    def _va_eager_plans(self, e: dict, key) -> dict:
        """The plan dict (layer key -> TreeAttentionPlan) of an eager batch shape, least recently used out."""
        plans = e["plans"]
        got = plans.get(key)
        if got is None:
            got = plans[key] = {}
            while len(plans) > self._VA_EAGER_PLANS:
                plans.popitem(last=False)
        else:
            plans.move_to_end(key)
        return got

    # ------------------------------------------------------------------ metadata

    def init_forward_metadata(self, forward_batch):
        if self.va_enabled and forward_batch.forward_mode.is_target_verify():
            self._va_init_verify(forward_batch, graph=False)
            return
        self.va_metadata = None
        super().init_forward_metadata(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if self.va_enabled and forward_batch.forward_mode.is_target_verify():
            self._va_init_verify(forward_batch, graph=self._va_graph is not None)
            return
        super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)

    def init_forward_metadata_in_graph(self, forward_batch):
        if self.va_enabled and forward_batch.forward_mode.is_target_verify():
            return  # everything is prepared outside the graph, into fixed buffers
        super().init_forward_metadata_in_graph(forward_batch)

    def _va_pack_prefix(self, forward_batch, bs, seq_lens, kv_indptr, out64) -> None:
        if out64.device.type == "cuda":
            self.kv_index_translator.pack_read_stream(
                forward_batch.kv_loc_plan,
                req_pool_indices=forward_batch.req_pool_indices,
                seq_lens=seq_lens,
                indptr=kv_indptr,
                out=out64,
            )
        else:  # CPU tensors: the same result through torch
            md.pack_prefix_slots(self.req_to_token, forward_batch.req_pool_indices, seq_lens, kv_indptr, out64)

    def _va_init_verify(self, forward_batch, graph: bool) -> None:
        spec = forward_batch.spec_info
        bs = len(forward_batch.req_pool_indices)
        # A padded CUDA-graph replay (build_replay_fb_view) gives the padded
        # capture buffers for req_pool_indices / seq_lens (bs lanes) but the real
        # batch's out_cache_loc and spec_info (raw_bs requests).
        raw_bs = _real_batch_size(forward_batch, bs)
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            # SGLang's opt-in metadata glue graph (SGLANG_ENABLE_METADATA_GLUE_GRAPH)
            # captures this prep; it reads this step's own out_cache_loc tensor,
            # whose address a captured graph would keep. The glue catches the
            # error and falls back to eager prep for good.
            raise RuntimeError("verify_attn backend: target-verify metadata reads the step's out_cache_loc "
                               "and cannot be captured in a CUDA graph; prepare it eagerly")
        if getattr(spec, "ragged_verify_layout", None) is not None:
            raise NotImplementedError("verify_attn backend: ragged target verify (per-request draft counts, "
                                      "SGLANG_RAGGED_VERIFY_MODE) is not supported; run with "
                                      "SGLANG_RAGGED_VERIFY_MODE=static or --attention-backend triton")
        n = self._target_verify_num_tokens_per_req(spec)
        seq_lens = forward_batch.seq_lens[:bs]
        dev = seq_lens.device
        g = self._va_graph if graph else None
        if g is not None and bs > g["max_bs"]:
            g = None  # larger than captured: eager buffers
        if g is not None and n != g["n"]:
            # The buffers and the captured launches (grid, mask words) are made
            # for g["n"] drafts per request; another count would be read wrongly.
            raise ValueError(f"verify_attn backend: this target verify has {n} draft tokens per request, but the "
                             f"CUDA-graph buffers were made for {g['n']} (--speculative-num-draft-tokens); "
                             "run it eagerly (--disable-cuda-graph) or with --attention-backend triton")
        if g is not None:
            max_kv_len = self.max_context_len + n
            bufs = g
        else:
            prefix_total = forward_batch.seq_lens_sum
            cpu_lens = forward_batch.seq_lens_cpu
            if prefix_total is None and cpu_lens is not None and cpu_lens.numel() >= bs:
                prefix_total = int(cpu_lens[:bs].sum())
            if prefix_total is None:  # no host lengths (needs_cpu_seq_lens asks the scheduler for them)
                prefix_total = bs * self.max_context_len
            cap = int(prefix_total) + bs * n + 1  # +1: the CPU pack's trash slot
            if cpu_lens is not None and cpu_lens.numel() >= bs and bs > 0:
                max_kv_len = min(_round_up_kv(int(cpu_lens[:bs].max()) + n), self.max_context_len + n)
            else:
                max_kv_len = self.max_context_len + n
            bufs = self._va_eager_buffers(bs, n, cap)
        out_cache_loc = forward_batch.out_cache_loc
        if out_cache_loc is None or out_cache_loc.numel() < raw_bs * n:
            got = None if out_cache_loc is None else tuple(out_cache_loc.shape)
            raise ValueError(f"verify_attn backend: out_cache_loc {got} holds fewer than the {raw_bs} real "
                             f"requests x {n} drafts of this target verify")
        custom_mask = getattr(spec, "custom_mask", None) if spec is not None else None
        causal = custom_mask is None or getattr(spec, "topk", None) == 1 or n == 1
        own = self._verify_mask.buffer if self._verify_mask is not None else None
        build = self._va_build_cuda if dev.type == "cuda" else self._va_build_torch
        qo_indptr, kv_indptr, idx32, kv_len, tree_mask = build(
            forward_batch, bufs, bs, raw_bs, n, seq_lens, out_cache_loc[: raw_bs * n],
            None if causal else custom_mask, own)
        self.va_metadata = VerifyMetadata(
            bs=bs, n=n, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=idx32, kv_len=kv_len,
            tree_mask=tree_mask, causal=causal, max_kv_len=max_kv_len,
        )
        if g is None:
            self.va_metadata.plans = self._va_eager_plans(bufs, (bs, n, causal, tree_mask is None, max_kv_len))
        # Code that inspects forward_metadata (the test kit's CUDA-graph
        # invariants: indptr monotonic, lengths >= 0) sees ours.
        self.forward_metadata = self.va_metadata

    def _va_build_cuda(self, forward_batch, bufs, bs, raw_bs, n, seq_lens, draft_slots, mask, own):
        """The batch's metadata on the GPU, into ``bufs`` (_va_buffers: the
        CUDA-graph ones or eager mode's): one verify_attn launch (indptrs,
        lengths, draft slots, the QLEN_ONLY mask's bits) and SGLang's pack of
        the prefix slots into the same int32 page table. A FULL-layout mask
        (another producer's) is converted by torch."""
        va = _import_verify_attn()
        draft_mask = None
        if (mask is not None and mask.dtype in (torch.bool, torch.uint8, torch.int8) and mask.is_contiguous()
                and md.is_qlen_only_layout(mask, raw_bs, n, own)):
            draft_mask = mask.view(-1)
        out = va.VerifyMetadata(bufs["qo_indptr"], bufs["kv_indptr"], bufs["kv_indices"], bufs["kv_len"],
                                bufs["tree_mask"] if draft_mask is not None else None)
        m = va.uniform_verify_metadata(seq_lens, draft_slots, n, draft_mask=draft_mask, out=out)
        self._va_pack_prefix(forward_batch, bs, seq_lens, m.kv_indptr, m.kv_indices)
        tree_mask = m.tree_mask
        if mask is not None and draft_mask is None:
            tree_mask = self._va_torch_mask(forward_batch, bufs, bs, raw_bs, n, seq_lens, mask, own)
        return m.qo_indptr, m.kv_indptr, m.kv_indices, m.kv_len, tree_mask

    def _va_build_torch(self, forward_batch, bufs, bs, raw_bs, n, seq_lens, draft_slots, mask, own):
        """The same metadata through torch alone (CPU tensors: the CI tests)."""
        qo_indptr = bufs["qo_indptr"][: bs + 1]
        kv_indptr = md.verify_kv_indptr(seq_lens, n, out=bufs["kv_indptr"])
        kv_len = md.verify_kv_len(seq_lens, n, out=bufs["kv_len"])
        idx64, idx32 = bufs["kv_indices64"], bufs["kv_indices"]
        self._va_pack_prefix(forward_batch, bs, seq_lens, kv_indptr, idx64)
        md.scatter_draft_slots(idx64, kv_indptr, seq_lens, draft_slots, n)
        idx32.copy_(idx64)
        tree_mask = None
        if mask is not None:
            tree_mask = self._va_torch_mask(forward_batch, bufs, bs, raw_bs, n, seq_lens, mask, own)
        return qo_indptr, kv_indptr, idx32, kv_len, tree_mask

    def _va_torch_mask(self, forward_batch, bufs, bs, raw_bs, n, seq_lens, mask, own):
        # bufs["n"] == n (the CUDA-graph buffers refuse another count; eager ones are remade for it)
        mask_out, pad_rows = bufs["tree_mask"], bufs["causal_rows"]
        cpu_lens = forward_batch.seq_lens_cpu
        if cpu_lens is not None and cpu_lens.numel() < raw_bs:
            cpu_lens = None
        return md.tree_mask_bits(mask, seq_lens, n, raw_bs, own_buffer=own, seq_lens_cpu=cpu_lens, out=mask_out,
                                 pad_rows=pad_rows)

    # ------------------------------------------------------------------ forward

    def _va_layer_key(self, layer, dtype):
        """The layer's plan key ``(H, Hkv, d_qk, d_vo, scale, dtype)``, its
        attributes checked (NotImplementedError for what verify_attn does not
        implement) at its first call and remembered per layer object: a forward
        of many layers pays the attribute reads once, not per layer and step."""
        ent = self._va_layer_keys.get(id(layer))
        if ent is not None and ent[0] is layer and ent[1][5] == dtype:
            return ent[1]
        self._va_check_layer(layer)
        hkv = 1 if self.use_mla else layer.tp_k_head_num
        key = (layer.tp_q_head_num, hkv, layer.qk_head_dim, layer.v_head_dim, float(layer.scaling), dtype)
        self._va_layer_keys[id(layer)] = (layer, key)
        return key

    def _va_check_layer(self, layer, sinks=None, score_mod=None, aux_tensors=None) -> None:
        problems = []
        if getattr(layer, "logit_cap", 0) and layer.logit_cap > 0:
            problems.append("logit soft-capping")
        if sinks is not None:
            problems.append("attention sinks")
        if score_mod is not None or aux_tensors is not None:
            problems.append("score_mod")
        if getattr(layer, "xai_temperature_len", None) not in (None, -1, 0):
            problems.append("xai temperature")
        if getattr(layer, "is_cross_attention", False):
            problems.append("cross attention")
        if getattr(self, "_va_kv_fp8", False):
            scales = _fp8_run_scales(layer)
            if scales is None:
                problems.append("fp8 KV scales other than a k_scale and v_scale with host values "
                                "(k_scale_float / v_scale_float)")
            elif self.use_mla and getattr(layer, "v_scale", None) is not None and scales[1] != scales[0]:
                # One latent cache holds K and V (stored as K / k_scale): the values take k_scale.
                problems.append(f"an MLA v_scale {scales[1]} other than its k_scale {scales[0]}")
        else:
            scales = _kv_scales(layer)
            if scales is not None:
                problems.append(f"KV scales k_scale={scales[0]}, v_scale={scales[1]} (only 1.0 is served)")
        sw = getattr(layer, "sliding_window_size", None)
        if sw is not None and sw > -1:
            problems.append("sliding window")
        if problems:
            raise NotImplementedError(
                f"verify_attn backend: layer {layer.layer_id} uses {', '.join(problems)} in target verify, "
                "which verify_attn does not implement; run with --attention-backend triton"
            )

    def _va_plan_for(self, m: VerifyMetadata, key):
        """The batch's plan for a layer key (made at its first layer; a layer
        with other heads, dims, scale or dtype gets its own), so that a forward
        of many layers plans once and runs per layer."""
        if m.plans is None:
            m.plans = {}
        plan = m.plans.get(key)
        if plan is None:
            H, hkv, d_qk, d_vo, scale, dtype = key
            plan = m.plans[key] = _import_verify_attn().TreeAttentionPlan(
                m.qo_indptr, m.kv_indptr, m.kv_indices, m.kv_len, num_qo_heads=H, num_kv_heads=hkv,
                head_dim_qk=d_qk, head_dim_vo=d_vo if self.use_mla else None, page_size=1,
                tree_mask=m.tree_mask, causal=m.causal, sm_scale=scale, dtype=dtype,
                max_q_len=m.n, max_kv_len=m.max_kv_len, kv_slot_runs=self._va_slot_runs,
                **({"kv_dtype": torch.float8_e4m3fn} if getattr(self, "_va_kv_fp8", False) else {}))
            self.va_plans_made += 1
        return plan

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None,
                       score_mod=None, aux_tensors=None, **kwargs):
        if not (self.va_enabled and forward_batch.forward_mode.is_target_verify()):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache,
                                          sinks=sinks, score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)
        m = self.va_metadata
        if m is None:
            raise RuntimeError("verify_attn backend: init_forward_metadata was not called for this target verify")
        if sinks is not None or score_mod is not None or aux_tensors is not None:
            self._va_check_layer(layer, sinks, score_mod, aux_tensors)
        key = self._va_layer_key(layer, q.dtype)
        if (k is None) != (v is None):
            raise ValueError("Both k and v should be None or not None")
        fp8 = getattr(self, "_va_kv_fp8", False)
        if k is not None and save_kv_cache:
            # The drafts' K/V go to the cache first (exactly as the Triton backend
            # stores them: an fp8 pool gets K / k_scale, V / v_scale, from copies);
            # the kernel then reads prefix + drafts from the cache.
            loc = KVWriteLoc.for_batch(forward_batch)
            if fp8 and layer.k_scale is not None and self.use_mla:
                # MLATokenToKVPool takes no scales: K / k_scale, as the Triton backend writes it.
                self.token_to_kv_pool.set_kv_buffer(layer, loc, k.clone().div_(layer.k_scale), v)
            elif fp8 and layer.k_scale is not None:
                self._set_kv_buffer(forward_batch, layer, loc, k.clone(), v.clone(), layer.k_scale, layer.v_scale)
            else:
                self._set_kv_buffer(forward_batch, layer, loc, k, v)

        H, _, d_qk, d_vo = key[:4]
        attn_out = getattr(forward_batch, "_attn_output", None)
        o = attn_out if attn_out is not None else q.new_empty((q.shape[0], H * d_vo))
        pool = self.token_to_kv_pool
        k_cache = pool.get_key_buffer(layer.layer_id)
        v_cache = None if self.use_mla else pool.get_value_buffer(layer.layer_id)
        plan = self._va_plan_for(m, key)
        if fp8:
            ks, vs = _fp8_run_scales(layer)  # checked by _va_layer_key's _va_check_layer
            # MLA: the values take k_scale (one cache; verify_attn refuses another v_scale).
            plan.run(q.view(-1, H, d_qk), k_cache, v_cache, out=o.view(-1, H, d_vo), k_scale=ks,
                     v_scale=None if self.use_mla else vs)
        else:
            plan.run(q.view(-1, H, d_qk), k_cache, v_cache, out=o.view(-1, H, d_vo))
        return o
