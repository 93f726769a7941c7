"""CPU tests of the Engine check (integration/sglang/engine_check/): its modes
parse through SGLang 0.5.23's own argument checks, its checkpoints' configs
read as GQA / MLA in SGLang's ModelConfig, the comparisons and the summary
table, and the probe plugin's counters and dual-GEMM switch. The GPU side is
``run_gpu_engine_check.sh``."""

import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "engine_check"))
sys.path.insert(0, HERE)

import modes  # noqa: E402
import report  # noqa: E402
import tiny_models  # noqa: E402
from test_plugin_cpu import _bare_backend, _sglang_or_skip, _verify_fb  # noqa: E402


def test_mode_table():
    ms = modes.MODES
    va = [m for m in ms.values() if m.backend == "verify_attn"]
    assert {m.spec for m in va} == {"eagle", "ngram", "eaglechain", "ngramchain"}
    assert {m.model for m in va} == {modes.GQA, modes.MLA}
    for m in va:
        assert m.triton_twin in ms and ms[m.triton_twin].backend == "triton" and ms[m.triton_twin].cuda_graph
        assert m.greedy in ms and ms[m.greedy].spec is None
    assert {m.spec for m in va if not m.cuda_graph} == {"eagle", "ngram"}
    order = modes.default_order()
    assert sorted(order) == sorted(ms) and all("_greedy_" in n for n in order[:2])


@pytest.mark.parametrize("name", sorted(modes.MODES))
def test_modes_pass_sglang_argument_checks(name, tmp_path):
    """Every mode's flags get through SGLang's own parsing and checks (trees at page 1,
    chains at page 64, the EAGLE draft on Triton, CUDA graphs off for _eager)."""
    _sglang_or_skip()
    import verify_attn_sglang
    from sglang.srt.server_args import prepare_server_args

    verify_attn_sglang.register()
    m = modes.MODES[name]
    sa = prepare_server_args(m.server_argv(str(tmp_path), 30000))
    assert sa.attention_backend == m.backend and sa.sampling_backend == "pytorch"
    assert sa.disable_cuda_graph == (not m.cuda_graph)
    if m.spec is None:
        assert sa.speculative_algorithm is None
        return
    assert sa.page_size == (64 if m.spec.endswith("chain") else 1)
    assert sa.speculative_algorithm == ("EAGLE" if m.spec.startswith("eagle") else "NGRAM")
    if m.spec.startswith("eagle"):
        assert sa.speculative_draft_attention_backend == "triton"
        assert sa.speculative_eagle_topk == (1 if m.spec == "eaglechain" else 4)
    elif m.spec == "ngramchain":
        assert sa.speculative_ngram_max_bfs_breadth == 1


def test_tiny_configs_read_as_gqa_and_mla(tmp_path):
    _sglang_or_skip()
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    for name, cfg in list(tiny_models.CONFIGS.items()) + [("llama_eagle_draft", tiny_models.DRAFT)]:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    gqa, mla, draft = (ModelConfig(str(tmp_path / n)) for n in ("llama_gqa", "dsv2_mla", "llama_eagle_draft"))
    assert gqa.attention_arch == AttentionArch.MHA and gqa.head_dim == 128
    assert (gqa.num_attention_heads, gqa.get_num_kv_heads(1)) == (16, 4)
    assert mla.attention_arch == AttentionArch.MLA and (mla.kv_lora_rank, mla.qk_rope_head_dim) == (512, 64)
    assert draft.hf_config.architectures == ["LlamaForCausalLMEagle"]
    assert draft.hf_config.hidden_size == mla.hf_config.hidden_size == gqa.hf_config.hidden_size


def test_draft_checkpoint_names():
    sd = tiny_models.draft_state_dict()
    h = tiny_models.HIDDEN
    assert sd["fc.weight"].shape == (h, 2 * h)
    assert torch.equal(sd["fc.weight"][:, :h].float(), torch.eye(h)) and not sd["fc.weight"][:, h:].any()
    assert not any("input_layernorm" in k or "embed" in k or "lm_head" in k for k in sd)
    assert all(k.startswith(("fc.", "layers.0.")) for k in sd)


def _run(outputs, top2=None, error=None, counts=None, meta=None):
    r = {"outputs": outputs, "counts": counts or {}, "meta": meta or []}
    if top2 is not None:
        r["top2"] = top2
    if error:
        r = {"error": error, "counts": {}}
    return r


def test_compare_first_difference_and_near_tie():
    top2 = [[[[-0.01, 5], [-3.0, 9]], [[-0.60, 6], [-0.65, 7]], [[-0.01, 8], [-4.0, 1]]]]
    g = _run([[5, 6, 8]], top2)
    assert report.compare(_run([[5, 6, 8]]), g, g) == "yes"
    assert report.compare(_run([[5, 7, 3]]), g, g) == "near-tie x 1 (first: req 0, token 1, gap 0.050)"
    assert report.compare(_run([[5, 6, 1]]), g, g) == "no (req 0, token 2)"  # gap 4 nats: a real difference
    assert report.compare(_run([[9, 6, 8]]), g, g) == "no (req 0, token 0)"
    assert report.compare(_run([[5, 6]]), g, g) == "no (req 0, token 2)"  # fewer tokens
    assert report.compare(_run([[5, 6, 8]]), None, g) == "-"
    assert report.compare(_run(None, error="boom"), g, g) == "-"


def test_compare_every_request_and_the_twin():
    """Each request is compared up to its own first difference (a near-tie in one
    request does not hide a real difference in a later one); against the Triton
    twin, a difference past a near-tie where both left the greedy path is that near-tie."""
    top2 = [[[[-0.01, 5], [-3.0, 9]], [[-0.60, 6], [-0.65, 7]], [[-0.01, 8], [-4.0, 1]]],
            [[[-0.01, 4], [-3.0, 2]], [[-0.01, 3], [-5.0, 2]]]]
    g = _run([[5, 6, 8], [4, 3]], top2)
    assert report.compare(_run([[5, 7, 3], [4, 2]]), g, g) == "no (req 1, token 1)"
    assert report.compare(_run([[5, 7, 3], [4, 3]]), g, g) == "near-tie x 1 (first: req 0, token 1, gap 0.050)"
    # An exact tie lists the two tokens in either order.
    g_tie = _run([[5, 6, 8]], [[[[-0.01, 5], [-3.0, 9]], [[-0.6, 7], [-0.6, 6]], [[-0.01, 8], [-4.0, 1]]]])
    assert report.compare(_run([[5, 7, 1]]), g_tie, g_tie) == "near-tie x 1 (first: req 0, token 1, gap 0.000)"
    run, twin = _run([[5, 7, 3], [4, 3]]), _run([[5, 7, 9], [4, 3]])
    assert report.compare(run, twin, g) == "near-tie x 1 (first: req 0, token 1, gap 0.050)"
    assert report.compare(_run([[5, 6, 8], [4, 3]]), _run([[9, 6, 8], [4, 3]]), g) == "no (req 0, token 0)"
    assert report.compare(run, twin, None) == "no (req 0, token 2)"  # no greedy run: no near-ties


def test_summary_table_and_verdicts(tmp_path):
    top2 = [[[[-0.01, 5], [-3.0, 9]], [[-0.01, 6], [-3.0, 7]]]]
    meta = [{"completion_tokens": 2, "spec_verify_ct": 1}]
    counts = {"verify_steps": 3, "graph_verify_steps": 2, "layer_calls": 4, "plans": 1,
              "kernels": {"k64 (tree, slot_runs=1)": 1}}
    runs = {
        "llama_gqa_greedy_triton": _run([[5, 6]], top2),
        "llama_gqa_eagle_triton": _run([[5, 6]], meta=meta),
        "llama_gqa_eagle_verify_attn": _run([[5, 6]], counts=counts, meta=meta),
        "llama_gqa_eagle_verify_attn_eager": _run([[5, 6]], meta=meta),  # ran, but no verify reached us
        "llama_gqa_ngram_verify_attn": _run([[5, 7]], counts=counts),
        "llama_gqa_ngram_triton": _run(None, error="RuntimeError: no"),
    }
    for name, r in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    names = list(runs)
    assert report.main(str(tmp_path), names) == 1
    text = (tmp_path / "summary.md").read_text()
    assert "| llama_gqa_eagle_verify_attn | ok | yes | yes | 2.00 | 3 (2 graph), 4 layer calls, 1 plans | " \
           "k64 (tree, slot_runs=1) x1 |" in text
    loaded = report.load_runs(str(tmp_path), names)
    assert report.verdict("llama_gqa_eagle_verify_attn", loaded)
    assert not report.verdict("llama_gqa_eagle_verify_attn_eager", loaded)  # zero verify steps served
    assert not report.verdict("llama_gqa_ngram_verify_attn", loaded)  # token 1 differs, 3-nat gap
    assert not report.verdict("llama_gqa_ngram_triton", loaded)
    assert "ENGINE CHECK: 2/5 speculative modes pass" in text


def test_probe_counts_verify_steps_plans_and_kernels(monkeypatch, tmp_path):
    """The probe's wrappers count a target verify prepared by VerifyAttnBackend, its
    layer calls, the plan and the kernel of the plan's layout, into $VA_ENGINE_COUNTS."""
    _sglang_or_skip()
    import va_engine_probe as probe
    from verify_attn_sglang import backend as be

    cls = be.VerifyAttnBackend
    for attr in ("_va_init_verify", "forward_extend", "_va_plan_for"):
        monkeypatch.setattr(cls, attr, getattr(cls, attr))  # restored after the test
    monkeypatch.setattr(cls, "_va_probe_wrapped", False, raising=False)
    monkeypatch.setattr(probe, "_STATE", {"verify_steps": 0, "graph_verify_steps": 0, "layer_calls": 0,
                                          "plans": 0, "kernels": {}})
    monkeypatch.setenv("VA_ENGINE_COUNTS", str(tmp_path))

    class Plan:
        def __init__(self, *args, **kw):
            self.planned = False

        def _plan_layout(self, *args):
            return (None, 0, {"name": "fake_kernel"})

        def run(self, q, k_cache, v_cache=None, *, out=None, **kw):
            if not self.planned:
                self.planned = True
                self._plan_layout("sig")
            return out

    monkeypatch.setattr(be, "_import_verify_attn", lambda: SimpleNamespace(TreeAttentionPlan=Plan))
    probe._wrap_backend()
    n, pool, width = 4, 3, 32
    b = _bare_backend(n, pool, torch.randint(0, 500, (pool, width), dtype=torch.int32))
    b.use_mla, b._va_slot_runs, b.va_plans_made = True, 1, 0
    cache = torch.zeros(600, 1, 576, dtype=torch.bfloat16)
    b.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: cache)
    fb = _verify_fb(n, torch.tensor([2, 0]), torch.tensor([9, 20], dtype=torch.int32),
                    torch.randint(500, 600, (2 * n,), dtype=torch.int64), None, 1)
    b.init_forward_metadata(fb)
    q = torch.zeros(2 * n, 16 * 576, dtype=torch.bfloat16)
    for i in range(2):
        layer = SimpleNamespace(layer_id=i, tp_q_head_num=16, tp_k_head_num=1, qk_head_dim=576, v_head_dim=512,
                                scaling=0.1, logit_cap=0, sliding_window_size=-1)
        b.forward_extend(q, None, None, layer, fb, save_kv_cache=False)
    with open(tmp_path / f"{os.getpid()}.json") as f:
        got = json.load(f)
    assert got == {"verify_steps": 1, "graph_verify_steps": 0, "layer_calls": 2, "plans": 1,
                   "kernels": {"fake_kernel (chain, slot_runs=1)": 1}}
    import run_mode

    assert run_mode.merge_counts([tmp_path / f"{os.getpid()}.json"] * 2)["layer_calls"] == 4


def test_probe_dual_gemm_switch(monkeypatch):
    """Without cutlass, DualGemm._select_mode answers "no dual GEMM" without importing
    SGLang's cute-DSL kernel module; with it, SGLang's own choice runs."""
    import importlib.util

    import va_engine_probe as probe

    called = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert probe._skip_dual_gemm_without_cutlass(lambda *a: called.append(a)) is None and not called
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert probe._skip_dual_gemm_without_cutlass(lambda *a: "mode", 1) == "mode"


def test_probe_hooks_sglang_dual_gemm():
    """register() puts an AROUND hook on the real DualGemm._select_mode (SGLang's HookRegistry)."""
    _sglang_or_skip()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    import va_engine_probe as probe

    target = "sglang.srt.layers.dual_gemm.DualGemm._select_mode"
    before = list(HookRegistry._hooks.get(target, []))
    try:
        HookRegistry.register(target, probe._skip_dual_gemm_without_cutlass, HookType.AROUND)
        HookRegistry.apply_hooks()
        from sglang.srt.layers.dual_gemm import DualGemm

        assert DualGemm._select_mode.__wrapped__ is not None
        if importlib_spec_missing("cutlass"):
            assert DualGemm._select_mode(SimpleNamespace(), None, 1024) is None
    finally:
        HookRegistry._hooks[target] = before


def importlib_spec_missing(name):
    import importlib.util

    return importlib.util.find_spec(name) is None
