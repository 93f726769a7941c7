"""Where a small call's time goes: the plan, each kernel's device time, graph replay.

    python3 tools/dev/kernel_breakdown.py --fixture=.gpu_stage/real_trees.safetensors \
        --num_splits=0,1,2,4,8 --configs=,gqa_d64_m64n64_s2

For each captured case of the fixture (``--workload=real``'s cases, random
values, page_size 1 scattered), or each bench grid shape ``--shapes`` names
(e.g. ``--shapes="gqa B1 H32/4 D128 T256"``), and each forced split-K count / configuration
tag: the plan's kernel, row tiles and splits; the device time of every kernel
one ``plan.run`` launches (CUPTI via torch.profiler, mean over --calls calls);
and the CUDA-graph replay time of one run (CUDA events, median of 5 rounds).
A GPU-machine tool (tools/dev/BUILD.bazel): the figures are for design, the
bench's table 5 is the record.
"""

import collections
import os
import statistics
import sys

from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

flags.DEFINE_string("fixture", None, "Captured fixture (default: VERIFY_ATTN_REAL_FIXTURE, as the bench).")
flags.DEFINE_list("num_splits", ["0"], "Forced split-K counts (0: the plan's).")
flags.DEFINE_list("configs", [""], "Configuration tags to force ('' : the plan's).")
flags.DEFINE_integer("calls", 20, "Profiled calls per row.")
flags.DEFINE_list("cases", [], "Only these case names (default: every case).")
flags.DEFINE_string("shapes", None, "Bench grid shapes instead of the fixture: those of the full grid whose name "
                    "contains any of these comma-separated substrings (bench --shapes's rule).")
FLAGS = flags.FLAGS


def _kernel_times(run, calls):
    """Mean device time per call of each kernel ``run()`` launches (name -> us)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    per = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time / calls
    return dict(per)


def _graph_us(run):
    """Median CUDA-graph replay time of one ``run()`` (us), 5 rounds of 200 replays."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    rounds = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(200):
            g.replay()
        b.record()
        b.synchronize()
        rounds.append(a.elapsed_time(b) * 1e3 / 200)
    return statistics.median(rounds)


def main(argv):
    del argv
    import torch

    from benchlib import inputs, ours, workload
    from benchlib import shapes as shapes_mod

    if FLAGS.shapes:
        shapes = shapes_mod.filter_shapes(shapes_mod.grid("full"), FLAGS.shapes)
    else:
        shapes = workload.load_shapes(FLAGS.fixture)
    if FLAGS.cases:
        shapes = [s for s in shapes if s.label in FLAGS.cases]
    for shape in shapes:
        case = inputs.build_case(shape, "cuda", page_size=1, seed=1)
        ins = inputs.make_inputs(case, 0)
        print(f"\n{shape.name}: q_lens {list(case.q_lens)}, prefix {list(case.prefix_lens)}, "
              f"heads {shape.heads}/{shape.kv_heads}, D{shape.d_qk}")
        for cfg in FLAGS.configs:
            for ns in (int(x) for x in FLAGS.num_splits):
                impl = ours.OursPaged(force_config=cfg or None, num_splits=ns)
                info = impl.plan(case, ins)
                run = impl.prepare(case, ins)
                ktimes = _kernel_times(run, FLAGS.calls)
                graph = _graph_us(run)
                kern = ", ".join(f"{n.split('(')[0][:60]} {t:.1f}" for n, t in sorted(ktimes.items(), key=lambda x: -x[1]))
                print(f"  {info['name']:<44} tile {info['tile_m']}x{info['tile_n']} splits {info['num_splits']:>3} "
                      f"| graph {graph:6.1f} us | "
                      f"kernels {sum(ktimes.values()):6.1f} us: {kern}")
                torch.cuda.synchronize()


if __name__ == "__main__":
    app.run(main)
