"""Eager target-verify forward through the SGLang plugin: wall time vs its kernels' device time.

A model calls attention once per layer. With CUDA graphs off (or a batch above
the captured sizes) the host must issue every layer's call before the GPU
runs out of work, else the GPU waits. This tool runs, per shape, what
SGLang's model runner does for one verify step, minus everything that is not
attention:

  forward = backend.init_forward_metadata(batch)          (once per step: the plan)
            + --layers x backend.forward_extend(q, k, v, layer, batch)

through SGLang's attention unit-test kit (the objects the bench's
``sglang_backend`` column builds: ``tools/bench/benchlib/baselines/sglang_backend.py``)
with --layers ``RadixAttention`` layers, each its own cache in the token pool
(the layers rotate over --sets input sets, so the cache is not served from L2
more than in a model), the forward context entered once per forward as
``ModelRunner`` does. Each input set's first layer is checked against the
float64 reference. Reported per shape, median of --rounds forwards:

  wall      CUDA-event time of one whole eager forward (what the step costs);
  kernels   the sum of the device time of every kernel and copy the forward
            launched (torch.profiler / CUPTI over one forward);
  host      host time to issue the forward (no synchronization inside),
            split into the metadata (init_forward_metadata), the first layer
            (plans the batch) and each later layer;
  wall / kernels, and each per layer.

Needs CUDA and SGLang (``--sglang_site``, default ``$VERIFY_ATTN_SGLANG_SITE``);
``integration/sglang/run_gpu_forward_cost.sh`` installs the staged SGLang and runs
this on the GPU machine.
"""

import json
import os
import statistics
import sys
import time

from absl import app, flags

_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "bench"))

from benchlib import check, inputs, shapes  # noqa: E402
from benchlib.baselines import sglang_backend  # noqa: E402

DEFAULT_SHAPES = ("mla B1 H16 T16 L4k ddtree,mla B1 H16 T64 L32k ddtree,mla B32 H16 T16 L4k ddtree,"
                  "mla B128 H16 T4 L4k ddtree,gqa B1 H32/4 D128 T16 L8k ddtree,gqa B16 H32/4 D128 T16 L8k ddtree")

flags.DEFINE_string("shapes", DEFAULT_SHAPES, "Comma-separated shape filters, as `tools/bench/bench.py --shapes`.")
flags.DEFINE_string("grid", "full", "The grid the shapes are taken from.")
flags.DEFINE_integer("layers", 78, "Attention layers per forward (GLM-5: 78, DeepSeek-V3: 61).")
flags.DEFINE_integer("sets", 4, "Input sets (q and KV cache) the layers rotate over.")
flags.DEFINE_bool("save_kv_cache", False, "forward_extend's save_kv_cache: also store the drafts' K/V "
                  "(SGLang's cache write, the same in every backend) in each layer.")
flags.DEFINE_integer("rounds", 9, "Timed forwards (the median is reported).")
flags.DEFINE_string("sglang_site", None, "Installed SGLang site (default $VERIFY_ATTN_SGLANG_SITE).")
flags.DEFINE_integer("profile_host", 0, "Also print the N Python functions with the most host time in one "
                     "forward (cProfile: by own time, then by cumulative time).")
flags.DEFINE_string("json_out", None, "Write the rows as JSON here.")
FLAGS = flags.FLAGS


def _kernel_time_us(forward) -> float:
    """Sum of the device time of every kernel / copy one ``forward()`` launches (CUPTI)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total += e.device_time
    return total


def _profile_host(forward, name) -> None:
    import cProfile
    import io
    import pstats

    import torch

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    forward()
    prof.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(FLAGS.profile_host)
        print(f"--- host profile of one forward by {key}: {name}\n{buf.getvalue()}")


def measure(shape, device, m):
    import torch

    case = inputs.build_case(shape, device, page_size=1, seed=1)
    sets = [inputs.make_inputs(case, i) for i in range(FLAGS.sets)]
    st = sglang_backend._Setup(m, "verify_attn", case)
    L, S = FLAGS.layers, len(sets)
    # The model's layers: one RadixAttention each, each its own cache in the
    # token pool (layer i: input set i % S), as get_key_buffer(layer_id) returns them.
    layers = [m.RadixAttention(layer_id=i, **st.layer_args) for i in range(L)]
    if st.mla:
        st.pool.kv_buffer = [sets[i % S].k_slots for i in range(L)]
    else:
        st.pool.k_buffer = [sets[i % S].k_slots for i in range(L)]
        st.pool.v_buffer = [sets[i % S].v_slots for i in range(L)]
    s = shape
    T = case.total_q
    qs = [x.q.reshape(T, s.heads * s.d_qk) for x in sets]
    ks, vs = [x.k_ext for x in sets], [x.v_ext for x in sets]
    backend, batch, ctx = st.backend, st.batch, st.ctx
    fwd, save = backend.forward_extend, FLAGS.save_kv_cache
    outs = [None] * L

    marks = [0.0, 0.0, 0.0]  # host clock after the metadata, after the first layer, at the end

    def forward():
        # What ModelRunner does per verify step: the forward context once, the
        # metadata (our plan) once, then every layer's attention.
        with torch.no_grad(), m.forward_context(ctx):
            backend.init_forward_metadata(batch)
            marks[0] = time.perf_counter()
            outs[0] = fwd(qs[0], ks[0], vs[0], layers[0], batch, save_kv_cache=save)
            marks[1] = time.perf_counter()
            for i in range(1, L):
                j = i % S
                outs[i] = fwd(qs[j], ks[j], vs[j], layers[i], batch, save_kv_cache=save)
        marks[2] = time.perf_counter()

    forward()
    torch.cuda.synchronize()
    for i in range(min(S, L)):  # each input set's first layer against the float64 reference
        err = check.err_vs_reference(outs[i].view(T, s.heads, s.d_vo), case, check.reference(case, sets[i]))
        if err is None or not err <= check.TOL:
            raise RuntimeError(f"{shape.name}: layer {i}: relative error {err} vs the float64 reference")
    plans0 = backend.va_plans_made
    for _ in range(3):
        forward()
    torch.cuda.synchronize()
    plans_per_forward = (backend.va_plans_made - plans0) / 3
    walls, hosts, metas, firsts, rests = [], [], [], [], []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(FLAGS.rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        e0.record()
        forward()
        e1.record()
        hosts.append((time.perf_counter() - t0) * 1e6)
        metas.append((marks[0] - t0) * 1e6)
        firsts.append((marks[1] - marks[0]) * 1e6)
        rests.append((marks[2] - marks[1]) * 1e6 / max(L - 1, 1))
        torch.cuda.synchronize()
        walls.append(e0.elapsed_time(e1) * 1e3)
    kernels = statistics.median(_kernel_time_us(forward) for _ in range(3))
    if FLAGS.profile_host:
        _profile_host(forward, shape.name)
    wall, host = statistics.median(walls), statistics.median(hosts)
    return {
        "shape": shape.name, "layers": L, "save_kv_cache": save, "plans_per_forward": plans_per_forward,
        "err_ref": err, "wall_us": wall, "kernels_us": kernels, "host_us": host,
        "wall_per_layer_us": wall / L, "kernels_per_layer_us": kernels / L, "host_per_layer_us": host / L,
        "wall_over_kernels": wall / kernels,
        "host_metadata_us": statistics.median(metas), "host_first_layer_us": statistics.median(firsts),
        "host_later_layer_us": statistics.median(rests),
    }


def main(argv):
    del argv
    import torch

    if not torch.cuda.is_available():
        sys.exit("sglang_forward_cost: needs a CUDA device")
    site, why = sglang_backend.resolve_site(FLAGS.sglang_site or sglang_backend.default_site())
    if why:
        sys.exit(f"sglang_forward_cost: {why}")
    m, why = sglang_backend.load(site)
    if m is None:
        sys.exit(f"sglang_forward_cost: {why}")
    picked = shapes.filter_shapes(shapes.grid(FLAGS.grid), FLAGS.shapes)
    if not picked:
        sys.exit(f"sglang_forward_cost: no shape of grid {FLAGS.grid!r} matches {FLAGS.shapes!r}")
    print(f"device: {torch.cuda.get_device_name()}; {FLAGS.layers} layers per forward; "
          f"wall = CUDA events over init_forward_metadata + {FLAGS.layers} x forward_extend "
          f"(save_kv_cache={FLAGS.save_kv_cache}), "
          f"kernels = sum of the forward's device time (CUPTI); median of {FLAGS.rounds}")
    head = (f"{'shape':34s} {'plans':>5s} {'wall us':>9s} {'kern us':>9s} {'host us':>9s} "
            f"{'wall/L':>8s} {'kern/L':>8s} {'host/L':>8s} {'wall/kern':>9s} {'h.meta':>7s} {'h.first':>7s} "
            f"{'h.later':>7s}")
    print(head)
    rows = []
    for s in picked:
        r = measure(s, torch.device("cuda"), m)
        rows.append(r)
        print(f"{r['shape']:34s} {r['plans_per_forward']:5.1f} {r['wall_us']:9.1f} {r['kernels_us']:9.1f} "
              f"{r['host_us']:9.1f} {r['wall_per_layer_us']:8.2f} {r['kernels_per_layer_us']:8.2f} "
              f"{r['host_per_layer_us']:8.2f} {r['wall_over_kernels']:9.3f} {r['host_metadata_us']:7.1f} "
              f"{r['host_first_layer_us']:7.1f} {r['host_later_layer_us']:7.2f}", flush=True)
    if FLAGS.json_out:
        with open(FLAGS.json_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
