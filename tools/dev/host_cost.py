"""Host time of one eager call, split into the Python path and the rest.

An eager `verify_attn.tree_attention_paged` call costs host time before the GPU
sees anything: argument validation, the torch.library custom-op dispatch,
output allocation, building the C-ABI parameters, planning and the launch. On
the H200 machine an eager MLA call (B4 T16 H16, 1000-row prefix) costs about
200 us of host time (BENCHMARKS.md), far more than that call's kernels take.
This tool times it two ways in one process, median of --rounds x --calls:

  real   the call as a user makes it (needs a CUDA device): everything;
  fake   the same call with the extension, the device guard and the stream
         lookup replaced by stubs that do nothing, on the same tensors (CPU
         tensors when there is no device): the Python path (validation, the
         custom-op dispatch, parameter building, and the output allocation on
         the tensors' device).

real - fake is what the rest costs: the device guard, the C-ABI's planning,
the launches and the error-word lookup.

    bazel run //tools/dev:host_cost -- --mode=fake      # any machine
    python3 tools/dev/host_cost.py --mode=both          # GPU machine, wheel installed
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
FLAGS = flags.FLAGS


class _StubExtension:
    """Stands in for verify_attn's compiled extension: same names, launches nothing."""

    DTYPE_FP16, DTYPE_BF16, MASK_TREE, MASK_CAUSAL, KV_FLAT, KV_PAGED = 0, 1, 0, 1, 0, 1

    class Params:
        pass

    def workspace_size(self, p):
        return 0

    def query_config(self, p):
        return {"name": "stub", "num_splits": 1}

    def attention(self, p):
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


def make_call(device):
    """The timed call on fresh random inputs (a random tree per request)."""
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
    parents = []
    for _ in range(B):
        parents += testing.random_parents("ddtree", T)
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo.cpu()).to(device)

    def call():
        return verify_attn.tree_attention_paged(q, k, None, qo, kvp, kvi, kvl, tree_mask=tree,
                                                max_q_len=T, max_kv_len=kv)

    return call


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

    saved = [(attention, "_load_C", attention._load_C), (attention, "_check_devices", attention._check_devices),
             (errors, "error_word_ptr", errors.error_word_ptr), (torch.cuda, "device", torch.cuda.device),
             (torch.cuda, "current_stream", torch.cuda.current_stream)]
    stub = _StubExtension()
    attention._load_C = lambda: stub
    attention._check_devices = lambda *a: None
    errors.error_word_ptr = lambda d: 0x1000
    torch.cuda.device = _NoDevice
    torch.cuda.current_stream = lambda d=None: _Stream()

    def undo():
        for mod, name, value in saved:
            setattr(mod, name, value)

    return undo


def main(argv):
    del argv
    import torch

    has_gpu = torch.cuda.is_available()
    if FLAGS.mode == "real" and not has_gpu:
        raise app.UsageError("--mode=real needs a CUDA device (use --mode=fake)")
    device = "cuda" if has_gpu else "cpu"
    call = make_call(device)
    sync = torch.cuda.synchronize if has_gpu else (lambda: None)
    print(f"eager tree_attention_paged MLA B{FLAGS.batch} T{FLAGS.q_len} H{FLAGS.heads} "
          f"prefix {FLAGS.prefix}, tensors on {device}, median of {FLAGS.rounds} x {FLAGS.calls} calls")
    real = None
    if FLAGS.mode in ("real", "both") and has_gpu:
        real = time_call(call, sync)
        print(f"  real: {real:7.1f} us host time per call")
    if FLAGS.mode in ("fake", "both"):
        undo = stubbed()
        try:
            fake = time_call(call, lambda: None)
        finally:
            undo()
        print(f"  fake: {fake:7.1f} us host time per call (Python path: validation, dispatch, params, outputs)")
        if real is not None:
            print(f"  real - fake: {real - fake:7.1f} us (device guard, C-ABI plan, launches)")


if __name__ == "__main__":
    app.run(main)
