"""A test-only SGLang plugin for the Engine check (not shipped in the wheel).

``run_gpu_engine_check.sh`` declares it as a second ``sglang.srt.plugins``
entry point (a generated ``.dist-info`` on ``PYTHONPATH``), so SGLang's own
``load_plugins()`` runs :func:`register` in every process it starts, the
scheduler included. It does two things:

* **Counts** what reached verify_attn: per process, the target-verify steps
  that ``VerifyAttnBackend`` prepared (eager and CUDA-graph replays: a replay
  prepares its metadata in Python too), the layer calls that ran in Python
  (eager steps and graph captures), the ``TreeAttentionPlan`` objects made and
  the kernels their layouts planned (``plan.info()['name']``, chain/tree,
  ``kv_slot_runs``). Written to ``$VA_ENGINE_COUNTS/<pid>.json`` after each
  event, so a process killed at shutdown has already left its numbers.
* **Skips the Blackwell dual GEMM when nvidia-cutlass-dsl is absent**:
  SGLang 0.5.23's ``DualGemm._select_mode`` (``srt/layers/dual_gemm.py``)
  imports ``sglang.kernels.ops.gemm.cutedsl_dual_gemm``, which imports
  ``cutlass`` at module level, for every Llama/Qwen2 MLP on CUDA. That kernel
  only runs on sm_100 (``can_use_dual_gemm`` requires ``is_sm100_supported()``),
  so on Hopper the answer is "no dual GEMM" either way; an AROUND hook
  (SGLang's ``HookRegistry``) returns that answer without the import.
"""

import importlib.util
import json
import os
import threading

_STATE = {"verify_steps": 0, "graph_verify_steps": 0, "layer_calls": 0, "plans": 0, "kernels": {}}
_LOCK = threading.Lock()
_DONE = False


def _dump() -> None:
    out = os.environ.get("VA_ENGINE_COUNTS")
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(_STATE, f)
    os.replace(path + ".tmp", path)


def _bump(key: str, n: int = 1) -> None:
    with _LOCK:
        _STATE[key] += n
        _dump()


def _note_kernel(info: dict, causal: bool, slot_runs: int) -> None:
    name = f"{info.get('name', '?')} ({'chain' if causal else 'tree'}, slot_runs={slot_runs})"
    with _LOCK:
        _STATE["kernels"][name] = _STATE["kernels"].get(name, 0) + 1
        _dump()


def _skip_dual_gemm_without_cutlass(original, *args, **kwargs):
    if importlib.util.find_spec("cutlass") is None:
        return None
    return original(*args, **kwargs)


def _wrap_backend() -> None:
    from verify_attn_sglang import backend as be  # noqa: PLC0415

    cls = be.VerifyAttnBackend
    if getattr(cls, "_va_probe_wrapped", False):
        return
    init_verify, forward_extend, plan_for = cls._va_init_verify, cls.forward_extend, cls._va_plan_for

    def _va_init_verify(self, forward_batch, graph):
        init_verify(self, forward_batch, graph)
        _bump("verify_steps")
        if graph:
            _bump("graph_verify_steps")

    def _forward_extend(self, q, k, v, layer, forward_batch, *args, **kwargs):
        if self.va_enabled and forward_batch.forward_mode.is_target_verify():
            _bump("layer_calls")
        return forward_extend(self, q, k, v, layer, forward_batch, *args, **kwargs)

    def _va_plan_for(self, m, key):
        before = self.va_plans_made
        plan = plan_for(self, m, key)
        if self.va_plans_made != before:
            _bump("plans")
            _wrap_plan_layout(plan, m.causal, self._va_slot_runs)
        return plan

    cls._va_init_verify, cls.forward_extend, cls._va_plan_for = _va_init_verify, _forward_extend, _va_plan_for
    cls._va_probe_wrapped = True


def _wrap_plan_layout(plan, causal: bool, slot_runs: int) -> None:
    """Record the kernel each new layout of this plan is planned with."""
    plan_layout = plan._plan_layout

    def _plan_layout(*args, **kwargs):
        entry = plan_layout(*args, **kwargs)
        _note_kernel(entry[2], causal, slot_runs)
        return entry

    plan._plan_layout = _plan_layout


def register() -> None:
    global _DONE
    if _DONE:
        return
    _DONE = True
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: PLC0415

    HookRegistry.register("sglang.srt.layers.dual_gemm.DualGemm._select_mode",
                          _skip_dual_gemm_without_cutlass, HookType.AROUND)
    _wrap_backend()
    _dump()
