"""Host time of one eager call: the one-shot function, a plan's run, FlashMLA's call.

A serving engine calls attention once per layer, so the host time of one call
matters as much as its kernels. This tool times, in one process, median of
--rounds x --calls back-to-back calls (no sync inside a round):

  oneshot   `verify_attn.tree_attention_paged` (validation, the custom-op
            dispatch, parameters, va_plan_create + va_plan_run);
  run       `TreeAttentionPlan.run` of a plan made once (what a model does per
            layer: va_plan_run only);
  newplan   a new `TreeAttentionPlan` of the batch and its first run (what the
            first layer of a verify step pays: the batch checks, the layout's
            validation, va_plan_create, the workspace, the launch);
  flashmla  FlashMLA's `flash_mla_with_kvcache` on the same shape (page block
            64; its scheduler metadata made once), with --flashmla_dir.

Each as `real` (needs a CUDA device) and, for ours, `fake`: the same call
with the extension, the device guard and the stream lookup replaced by stubs
that do nothing (the Python path alone); real - fake is the C-ABI and the
launch. The shape: MLA, --batch requests of --q_len drafts, --heads heads,
--prefix rows of prefix, page_size 1.

    bazel run //tools/dev:host_cost -- --mode=fake      # any machine
    python3 tools/dev/host_cost.py --mode=both --flashmla_dir=.gpu_stage/baselines   # GPU machine
"""

import statistics
import time

from absl import app, flags

flags.DEFINE_enum("mode", "both", ["real", "fake", "both"], "What to time (real needs a CUDA device).")
flags.DEFINE_integer("batch", 4, "Requests.")
flags.DEFINE_integer("q_len", 16, "Draft tokens per request.")
flags.DEFINE_integer("heads", 16, "Query heads (MLA: one KV head, 576/512).")
flags.DEFINE_integer("prefix", 1000, "Committed prefix rows per request.")
flags.DEFINE_integer("calls", 200, "Calls per round.")
flags.DEFINE_integer("rounds", 5, "Rounds (the median is reported).")
flags.DEFINE_bool("phases", False, "Also time newplan's phases (real only): the TreeAttentionPlan, its layout's "
                  "plan (info), the first run, a second run; median of --calls.")
flags.DEFINE_string("flashmla_dir", None, "Staged FlashMLA wheel (tools/bench/fetch_baselines.sh): also time "
                    "flash_mla_with_kvcache on the same shape.")
FLAGS = flags.FLAGS


class _StubExtension:
    """Stands in for verify_attn's compiled extension: same names, launches nothing."""

    DTYPE_FP16, DTYPE_BF16, MASK_TREE, MASK_CAUSAL, KV_FLAT, KV_PAGED = 0, 1, 0, 1, 0, 1

    class Params:
        def set(self, **fields):  # the binding's Params.set
            self.__dict__.update(fields)

    class Plan:
        def __init__(self, p, *options):
            pass

        def info(self):
            return {"name": "stub", "num_splits": 1, "workspace_bytes": 0}

        def run(self, *pointers):
            pass


class _NoDevice:
    def __init__(self, *a):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Stream:
    cuda_stream = 0


def make_calls(device):
    """The timed calls on fresh random inputs (a random tree per request): (oneshot, run, newplan)."""
    import torch

    import verify_attn
    from verify_attn import masks, testing

    B, T, H, P = FLAGS.batch, FLAGS.q_len, FLAGS.heads, FLAGS.prefix
    kv = P + T
    qo = (torch.arange(0, B + 1, dtype=torch.int32) * T).to(device)
    kvp = (torch.arange(0, B + 1, dtype=torch.int32) * kv).to(device)
    kvi = torch.randperm(B * kv + 7)[: B * kv].to(torch.int32).to(device)
    kvl = torch.full((B,), kv, dtype=torch.int32).to(device)
    k = torch.randn(B * kv + 7, 1, 1, 576).to(torch.bfloat16).to(device)
    q = torch.randn(B * T, H, 576).to(torch.bfloat16).to(device)
    out = torch.empty(B * T, H, 512, dtype=torch.bfloat16, device=device)
    parents = []
    for _ in range(B):
        parents += testing.random_parents("ddtree", T)
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo.cpu()).to(device)

    def oneshot():
        return verify_attn.tree_attention_paged(q, k, None, qo, kvp, kvi, kvl, tree_mask=tree,
                                                max_q_len=T, max_kv_len=kv, out=out)

    def new_plan():
        return verify_attn.TreeAttentionPlan(
            qo, kvp, kvi, kvl, num_qo_heads=H, head_dim_qk=576, head_dim_vo=512, tree_mask=tree,
            max_q_len=T, max_kv_len=kv)

    holder = {}

    def run():
        plan = holder.get("plan")
        if plan is None:  # made once, outside the timing (time_call warms up first)
            plan = holder["plan"] = new_plan()
        return plan.run(q, k, out=out)

    def newplan():
        return new_plan().run(q, k, out=out)

    def phases(sync):
        """Median host time (us) of each phase of a new plan's first runs."""
        t = {"TreeAttentionPlan()": [], "info() (the layout's plan)": [], "first run": [], "second run": []}
        for _ in range(FLAGS.calls):
            sync()
            t0 = time.perf_counter()
            plan = new_plan()
            t1 = time.perf_counter()
            plan.info(q, k, out=out)
            t2 = time.perf_counter()
            plan.run(q, k, out=out)
            t3 = time.perf_counter()
            plan.run(q, k, out=out)
            t4 = time.perf_counter()
            for key, a, b in zip(t, (t0, t1, t2, t3), (t1, t2, t3, t4)):
                t[key].append((b - a) * 1e6)
        return {key: statistics.median(v) for key, v in t.items()}

    return oneshot, run, newplan, phases


def make_flashmla_call():
    """FlashMLA's call on the same shape (page block 64), or None with the reason printed."""
    import os
    import sys

    import torch

    # benchlib: tools/bench/benchlib, beside this script's folder tools/dev/.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    from benchlib.baselines import flashmla

    try:
        fm = flashmla.load(FLAGS.flashmla_dir)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        print(f"  flashmla: unavailable ({type(e).__name__}: {e})")
        return None
    B, T, H, P = FLAGS.batch, FLAGS.q_len, FLAGS.heads, FLAGS.prefix
    kv = P + T
    blocks = (kv + 63) // 64
    k_cache = torch.randn(B * blocks + 3, 64, 1, 576, device="cuda").to(torch.bfloat16)
    table = torch.randperm(B * blocks + 3, device="cuda")[: B * blocks].to(torch.int32).view(B, blocks)
    fi = flashmla.FlashMLAInputs(q=torch.randn(B, T, H, 576, device="cuda").to(torch.bfloat16), k_cache=k_cache,
                                 block_table=table, cache_seqlens=torch.full((B,), kv, dtype=torch.int32,
                                                                             device="cuda"),
                                 shared_cache=False)
    return flashmla.make_call(fm, fi, 576 ** -0.5)


def time_call(call, sync):
    for _ in range(min(50, FLAGS.calls)):
        call()
    sync()
    per_call = []
    for _ in range(FLAGS.rounds):
        t0 = time.perf_counter()
        for _ in range(FLAGS.calls):
            call()
        per_call.append((time.perf_counter() - t0) / FLAGS.calls * 1e6)
        sync()  # the queue drains between rounds, not inside the timed loop
    return statistics.median(per_call)


def stubbed():
    """Swaps the extension and the CUDA host calls for stubs; returns an undo function."""
    import torch

    from verify_attn import attention, errors
    from verify_attn.plan import TreeAttentionPlan

    saved = [(attention, "_load_C", attention._load_C), (attention, "_check_devices", attention._check_devices),
             (TreeAttentionPlan, "_check_batch_device", TreeAttentionPlan.__dict__["_check_batch_device"]),
             (errors, "error_word_ptr", errors.error_word_ptr), (torch.cuda, "device", torch.cuda.device),
             (torch.cuda, "current_stream", torch.cuda.current_stream),
             (torch._C, "_cuda_getCurrentRawStream", getattr(torch._C, "_cuda_getCurrentRawStream", None))]
    stub = _StubExtension()
    attention._load_C = lambda: stub
    attention._check_devices = lambda *a: None
    TreeAttentionPlan._check_batch_device = staticmethod(lambda t: None)  # CPU tensors stand in
    errors.error_word_ptr = lambda d: 0x1000
    torch.cuda.device = _NoDevice
    torch.cuda.current_stream = lambda d=None: _Stream()
    torch._C._cuda_getCurrentRawStream = lambda index: 0

    def undo():
        for mod, name, value in saved:
            if value is None:
                delattr(mod, name)
            else:
                setattr(mod, name, value)

    return undo


def main(argv):
    del argv
    import torch

    has_gpu = torch.cuda.is_available()
    if FLAGS.mode == "real" and not has_gpu:
        raise app.UsageError("--mode=real needs a CUDA device (use --mode=fake)")
    device = "cuda" if has_gpu else "cpu"
    *made, phases = make_calls(device)
    calls = dict(zip(("oneshot", "run", "newplan"), made))
    sync = torch.cuda.synchronize if has_gpu else (lambda: None)
    print(f"eager host time per call, MLA B{FLAGS.batch} T{FLAGS.q_len} H{FLAGS.heads} prefix {FLAGS.prefix}, "
          f"tensors on {device}, median of {FLAGS.rounds} x {FLAGS.calls} calls")
    real = {}
    if FLAGS.mode in ("real", "both") and has_gpu:
        for name, call in calls.items():
            real[name] = time_call(call, sync)
            print(f"  real {name:8s}: {real[name]:7.1f} us")
        if FLAGS.phases:
            for key, us in phases(sync).items():
                print(f"  real newplan phase {key:28s}: {us:7.1f} us")
        if FLAGS.flashmla_dir:
            fcall = make_flashmla_call()
            if fcall is not None:
                print(f"  real flashmla: {time_call(fcall, sync):7.1f} us (flash_mla_with_kvcache, page block 64)")
    if FLAGS.mode in ("fake", "both"):
        calls = dict(zip(("oneshot", "run", "newplan"), make_calls(device)[:3]))  # the plan made under the stubs
        undo = stubbed()
        try:
            for name, call in calls.items():
                fake = time_call(call, lambda: None)
                print(f"  fake {name:8s}: {fake:7.1f} us (the Python path)")
                if name in real:
                    print(f"  real - fake {name:8s}: {real[name] - fake:7.1f} us (device guard, C-ABI, launches)")
        finally:
            undo()


if __name__ == "__main__":
    app.run(main)
