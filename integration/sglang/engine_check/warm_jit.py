"""Build SGLang's JIT modules the speculative modes need, in parallel, before the Engines start.

    python warm_jit.py

SGLang 0.5.23 compiles some kernels on first use with nvcc / the host compiler
(``sglang.kernels.jit``, cached in ``$SGLANG_JIT_CACHE_DIR``): the EAGLE /
NGRAM tree kernels (build tree, greedy tree verify, NGRAM's tree-mask
reconstruction: ``kernels/ops/speculative/tree.py``) and NGRAM's C++ n-gram
corpus (``kernels/ops/speculative/ngram_corpus.py``). Building them here, once,
keeps parallel Engines from each compiling them. A failure is printed, not
raised: the Engine that needs the module then reports it.
"""

import time
from concurrent.futures import ThreadPoolExecutor

MODULES = (
    ("sglang.kernels.ops.speculative.tree", "_jit_tree_module"),
    ("sglang.kernels.ops.speculative.ngram_corpus", "get_ngram_corpus_cls"),
)


def build(module: str, fn: str) -> str:
    import importlib  # noqa: PLC0415

    t0 = time.time()
    try:
        getattr(importlib.import_module(module), fn)()
        return f"built {module}.{fn} in {time.time() - t0:.1f} s"
    except Exception as e:  # noqa: BLE001
        return f"FAILED {module}.{fn} after {time.time() - t0:.1f} s: {type(e).__name__}: {str(e)[:3000]}"


def main() -> None:
    with ThreadPoolExecutor(len(MODULES)) as ex:
        for line in ex.map(lambda m: build(*m), MODULES):
            print(line, flush=True)


if __name__ == "__main__":
    main()
