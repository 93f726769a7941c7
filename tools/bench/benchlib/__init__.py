"""The verify_attn benchmark's library (`tools/bench/bench.py` is the absl main).

Importable as ``benchlib`` with ``tools/bench/`` on ``sys.path`` (what running
``tools/bench/bench.py`` and the Bazel target give). One idea per module:

- :mod:`benchlib.shapes`: the shape grid (``--grid``, ``--shapes``);
- :mod:`benchlib.inputs`: random trees, scattered paged caches, SGLang's FULL mask;
- :mod:`benchlib.timing`: CUDA events + medians, CUDA-graph replay, L2 rotation;
- :mod:`benchlib.floor`: DESIGN.md §3 bytes/FLOPs and the measured ceilings;
- :mod:`benchlib.check`: outputs vs the float64 reference (or a subsample of it);
- :mod:`benchlib.ours`: this project's flat and paged kernels;
- :mod:`benchlib.baselines`: SGLang's Triton kernels, FlexAttention, FlashInfer;
- :mod:`benchlib.runner`: one shape through every implementation, never raising;
- :mod:`benchlib.report`: table, JSON, PNG, progress;
- :mod:`benchlib.workload`: ``--workload=real`` (captured fixtures).

Every module imports on a CPU-only machine.
"""
