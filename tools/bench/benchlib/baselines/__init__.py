"""Implementations the benchmark runs side by side.

Every implementation is an :class:`Impl`: ``unavailable()`` says why it cannot
run at all in this process (``None`` when it can: e.g. "not staged (run
tools/bench/fetch_baselines.sh)"), ``applies(case)`` why it does not apply to one
shape (``None`` when it does: e.g. the chain-only kernel on a tree), and
``prepare(case, inputs)`` returns a zero-argument callable that computes the
output ``[total_q, H, Dvo]`` (writing a preallocated buffer where the
implementation allows it) and can be replayed in a CUDA graph. Any exception
from ``prepare`` or the callable is reported in the shape's row as that
implementation's failure; it never stops the benchmark.

Modules: :mod:`.sglang_triton` (SGLang 0.5.23's ``extend_attention_fwd`` with
the FULL tree mask, and ``verify_shared_kv_fwd`` for chains), :mod:`.flex`
(``torch.compile``d FlexAttention), :mod:`.flashinfer` (custom-mask paged
prefill, GQA; not stageable on the GPU machine, see there), :mod:`.flashmla`
(FlashMLA's dense decode, ``causal=True``: the chain of every MLA row; its
wheel staged on request), :mod:`.torch_ref` (the PyTorch reference in fp32,
timed only in ``--dry_run``).
"""

from typing import Callable, Optional


class NotApplicable(Exception):
    """The implementation does not serve this shape (reported as 'n/a: reason')."""


class Impl:
    name = "impl"            # JSON key and table column
    label = "impl"           # human label
    competitor = True        # a speedup is reported against it
    graphable = True         # try CUDA-graph replay
    check_vs_ours = True     # also compare with our kernel's output
    # "tree": computes the row's own problem; "chain": computes the causal chain of
    # the row's shape whatever its tree (FlashMLA): on a tree row it is checked
    # against the chain's reference, never against our (tree) output
    computes = "tree"
    # True: on a shape it never serves the row says "n/a" (applies()) even when the
    # implementation is unavailable in this process (FlashMLA on GQA rows)
    na_before_unavailable = False

    def unavailable(self) -> Optional[str]:
        return None

    def applies(self, case) -> Optional[str]:
        return None

    def prepare(self, case, inputs) -> Callable[[], object]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.label

    def release(self) -> None:
        """Drop per-shape state (called after every shape)."""


def short_reason(exc: BaseException, limit: int = 160) -> str:
    """One line naming the exception, cut to ``limit`` characters."""
    text = str(exc).strip().splitlines()
    first = ""
    for line in text:
        line = line.strip()
        if line:
            first = line
            break
    # Triton/Inductor put the useful part in the last lines of long messages
    for line in reversed(text):
        low = line.lower()
        if "out of resource" in low or "shared memory" in low or "required:" in low:
            first = line.strip()
            break
    msg = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."
