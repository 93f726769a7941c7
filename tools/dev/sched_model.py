"""Timing model of one CTA of the sm_90a MLA kernel, per KV tile pair (a design aid).

The tensor pipe is one FIFO server (wgmma groups run in issue order); each
consumer warpgroup is a chain of steps; a K stage handed back to the producer is
available again L microseconds later. It compares the two consumer schedules
tried on the H200 (docs/design_sm90_mla.md):

  exchange  kernels/sm90/mla_wgmma_kernel.cuh: both consumers compute their
            tile's scores, exchange row maxima, do their softmax at the same
            time, then both P V over both tiles; both stages are handed back
            after the P V.
  seesaw    FlashMLA-style (branch exp/seesaw-tma): consumer 0 does its softmax
            and its own-tile P V while consumer 1 does its softmax; max chain
            m -> m0 -> m1; each stage handed back in two parts.

Default step times (us, one CTA, H200) are calibrated on the exchange kernel,
B1 H16 T64 L32k (32 tile pairs per CTA): the model gives 139 us with loads
hidden (measured 143 us with a hand-back-early build) and 160 us at L = 1.2
(measured 159 us). The seesaw as built measured 233-240 us (211-215 us with
loads hidden) where the model predicts 126-148 us: its gap is in the
implementation, not the schedule. The ncu source counters
(tools/dev/ncu_stalls.py) show two causes: the seesaw producer reads each row
offset through a generic volatile pointer between its copies (one memory
latency per 16-byte copy), and refills go through the producer instead of
being issued by the consumer that hands a block group back; with both fixed it
measures 178 us (branch exp/seesaw-tma), while the model's L counts only the
landing latency.

    bazel run //tools/dev:sched_model                    # both schedules, L = 0 .. 2 us
    bazel run //tools/dev:sched_model -- --scores_us=0.9 # what if the scores ran faster
"""

from absl import app, flags

flags.DEFINE_float("scores_us", 1.05, "One tile's scores S = Q K^T (36 wgmma m64n64k16).")
flags.DEFINE_float("pv_us", 0.46, "One P V group (4 wgmma m64n256k16, 256 output columns).")
flags.DEFINE_float("softmax_us", 0.3, "Mask, row max, exp2 and O rescale of one tile.")
flags.DEFINE_float("store_us", 0.1, "Storing P to shared memory and the barrier after it.")
flags.DEFINE_integer("pairs", 32, "Tile pairs per CTA (B1 H16 T64 L32k: 32).")
FLAGS = flags.FLAGS


class Pipe:
    """The tensor pipe: a group issued at t starts when the previous one ended."""

    def __init__(self):
        self.free = 0.0

    def run(self, issue, dur):
        self.free = max(issue, self.free) + dur
        return self.free


def exchange(S, PV, SM, ST, L, pairs):
    pipe, t, avail, ends = Pipe(), 0.0, 0.0, []
    for _ in range(pairs):
        s0 = pipe.run(max(t, avail - 0.5 * S), S)  # blocks start as they land
        s1 = pipe.run(max(t, avail - 0.5 * S), S)
        ready = max(s0, s1) + SM + ST  # max exchange, softmax, P stores
        for _ in range(4):
            t = pipe.run(ready, PV)
        avail = t + L
        ends.append(t)
    return ends


def seesaw(S, PV, SM, ST, L, pairs):
    pipe, ends = Pipe(), []
    avail = {"A0": 0.0, "A1": 0.0, "B0": 0.0, "B1": 0.0}  # stage, release group
    t0 = t1 = 0.0
    for _ in range(pairs):
        s_a = pipe.run(max(t0, avail["A0"], avail["A1"] - 0.5 * S), S)
        s_b = pipe.run(max(t1, avail["B0"], avail["B1"] - 0.5 * S), S)
        scale0 = s_a + SM  # consumer 0 publishes m0
        lpv0 = pipe.run(scale0, PV)  # own P from registers
        scale1 = max(s_b, scale0) + SM  # consumer 1 publishes m1
        pb = scale1 + ST
        lpv1 = pipe.run(pb, PV)
        pa = max(lpv0, scale1) + ST  # consumer 0 rescales and stores P_A
        rpv0 = pipe.run(max(pa, pb), PV)
        rpv1 = pipe.run(max(pa, lpv1 - PV), PV)
        avail = {"A0": lpv0 + L, "A1": rpv1 + L, "B0": lpv1 + L, "B1": rpv0 + L}
        t0, t1 = rpv0, rpv1
        ends.append(max(rpv0, rpv1))
    return ends


def per_pair(ends):
    warm = len(ends) // 3
    return (ends[-1] - ends[warm]) / (len(ends) - 1 - warm)


def main(_):
    args = (FLAGS.scores_us, FLAGS.pv_us, FLAGS.softmax_us, FLAGS.store_us)
    tensor = 2 * FLAGS.scores_us + 4 * FLAGS.pv_us
    print(f"tensor work per pair {tensor:.2f} us -> {tensor * FLAGS.pairs:.0f} us per CTA at 100% busy")
    for L in (0.0, 0.6, 1.2, 2.0):
        ex = per_pair(exchange(*args, L, FLAGS.pairs))
        ss = per_pair(seesaw(*args, L, FLAGS.pairs))
        print(f"L = {L:.1f} us: exchange {ex:.2f} us/pair ({ex * FLAGS.pairs:.0f} us), "
              f"seesaw {ss:.2f} us/pair ({ss * FLAGS.pairs:.0f} us)")


if __name__ == "__main__":
    app.run(main)
