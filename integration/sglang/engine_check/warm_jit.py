"""Build SGLang's JIT modules the speculative modes need, in parallel, before the Engines start.

    python warm_jit.py

SGLang 0.5.23 compiles some kernels on first use with nvcc / the host compiler
(``sglang.kernels.jit``, cached in ``$SGLANG_JIT_CACHE_DIR``): the EAGLE /
NGRAM tree kernels (build tree, greedy tree verify, NGRAM's tree-mask
reconstruction: ``kernels/ops/speculative/tree.py``) and NGRAM's C++ n-gram
corpus (``kernels/ops/speculative/ngram_corpus.py``), and the KV-cache stores
every forward reaches (traced on CPU under a faked H100, see the README's
Engine check): ``store_cache`` for the Llama target's and the draft's 4 x 128
bf16 K/V rows (1024 bytes; ``kernels/ops/kvcache/kvcache.py``, called from
``MHATokenToKVPool.set_kv_buffer``) and ``set_mla_kv_buffer`` for the MLA
rows (512 + 64 bf16: 1024 + 128 bytes; ``kernels/ops/kvcache/set_mla_kv_buffer.py``,
from ``MLATokenToKVPool.set_mla_kv_buffer``). The two stores have fallbacks
(an indexed copy, a Triton kernel) when their build fails, but without this
warm-up every Engine would start its own build on the first prefill. The
arguments are the ones SGLang derives at run time (``num_threads`` 0: its
heuristic; PDL from ``sglang.kernels.jit.utils.is_arch_support_pdl``), so the
Engines find these builds in ``SGLANG_JIT_CACHE_DIR``. A failure is printed,
not raised: the Engine that needs the module then reports it (or falls back).
"""

import time
from concurrent.futures import ThreadPoolExecutor



def _pdl():
    from sglang.kernels.jit.utils import is_arch_support_pdl  # noqa: PLC0415

    return is_arch_support_pdl()


# (module, function, arguments or a callable that returns them)
MODULES = (
    ("sglang.kernels.ops.speculative.tree", "_jit_tree_module", ()),
    ("sglang.kernels.ops.speculative.ngram_corpus", "get_ngram_corpus_cls", ()),
    ("sglang.kernels.ops.kvcache.kvcache", "_jit_kvcache_module", (1024, 1024, 0)),
    ("sglang.kernels.ops.kvcache.set_mla_kv_buffer", "set_mla_kv_buffer_module",
     lambda: (1024, 128, _pdl())),
)


def build(module: str, fn: str, args=()) -> str:
    import importlib  # noqa: PLC0415

    t0 = time.time()
    try:
        args = args() if callable(args) else args
        getattr(importlib.import_module(module), fn)(*args)
        return f"built {module}.{fn}{tuple(args)} in {time.time() - t0:.1f} s"
    except Exception as e:  # noqa: BLE001
        return f"FAILED {module}.{fn} after {time.time() - t0:.1f} s: {type(e).__name__}: {str(e)[:3000]}"


def main() -> None:
    import importlib  # noqa: PLC0415

    # Imports first, one after another on this thread: modules that import
    # each other's packages, imported from several threads at once, trip
    # Python's import-lock deadlock detection (_DeadlockError). The builds
    # (compiler subprocesses) then run in parallel.
    for module, _, _ in MODULES:
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001
            print(f"FAILED import {module}: {type(e).__name__}: {str(e)[:3000]}", flush=True)
    with ThreadPoolExecutor(len(MODULES)) as ex:
        for line in ex.map(lambda m: build(*m), MODULES):
            print(line, flush=True)


if __name__ == "__main__":
    main()
