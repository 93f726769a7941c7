"""verify_attn benchmark: the product's main job (`bazel run //tools:bench`).

Prints the GPU and the toolchain the installed build carries. The timed shape
grid (this project vs SGLang's kernels, FlashInfer, FlexAttention; DESIGN.md
§2-3) arrives with the performance issue. Without a CUDA device it says so
and exits with status 2.
"""

import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("json_out", None, "Write the results as JSON to this path.")


def gpu_and_toolchain():
    """Return a dict describing the device and this build, or raise RuntimeError."""
    import torch

    import verify_attn

    info = verify_attn.runtime_info()
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible to torch (torch %s)" % torch.__version__)
    props = torch.cuda.get_device_properties(0)
    info.update({
        "device": props.name,
        "capability": "sm_%d%d" % (props.major, props.minor),
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    })
    return info


def main(argv):
    del argv
    try:
        info = gpu_and_toolchain()
    except RuntimeError as e:
        print("verify_attn bench: %s. The benchmark needs an NVIDIA GPU "
              "(sm_90 or sm_120); nothing was measured." % e, file=sys.stderr)
        return 2
    width = max(len(k) for k in info)
    for k, v in info.items():
        print("%-*s  %s" % (width, k, v))
    if FLAGS.json_out:
        import json
        with open(FLAGS.json_out, "w") as f:
            json.dump(info, f, indent=2)
    return 0


if __name__ == "__main__":
    app.run(main)
