"""The Engine check's modes: which model, backend and speculative setup each runs.

A mode is one ``sglang.Engine`` start. Names read ``<model>_<spec>_<backend>[_eager]``:
``greedy`` is plain decoding (the reference), ``eagle`` / ``ngram`` trees run at
``--page-size 1`` (SGLang 0.5.23 refuses trees at a larger page size for any
backend but its own list), ``eaglechain`` / ``ngramchain`` are top-k 1 chains at
``--page-size 64`` (where verify_attn passes ``kv_slot_runs=64``), ``_eager``
turns CUDA graphs off. Each verify_attn mode is compared with its model's
greedy mode and with :attr:`Mode.triton_twin` (the same setup on SGLang's Triton
backend, CUDA graphs on).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

GQA, MLA, DRAFT = "llama_gqa", "dsv2_mla", "llama_eagle_draft"

# Trees: top-k 4, 3 draft steps, 8 verified tokens (EAGLE); NGRAM: 8 tokens,
# its BFS breadth (the tree's top-k) at SGLang's default 10. Chains: top-k 1.
EAGLE_TREE = ("--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4",
              "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8")
EAGLE_CHAIN = ("--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1",
               "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4")
NGRAM_TREE = ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8")
NGRAM_CHAIN = NGRAM_TREE + ("--speculative-ngram-max-bfs-breadth", "1")
SPEC = {"eagle": (EAGLE_TREE, 1), "ngram": (NGRAM_TREE, 1),
        "eaglechain": (EAGLE_CHAIN, 64), "ngramchain": (NGRAM_CHAIN, 64)}

# Every Engine: tiny, greedy, token ids in and out, small KV pool and graph batch.
# A fixed small KV pool (--max-total-tokens) so that Engines sharing the GPU size alike;
# PyTorch sampling (FlashInfer's does not travel; greedy is an argmax either way).
COMMON = ("--skip-tokenizer-init", "--dtype", "bfloat16", "--mem-fraction-static", "0.1",
          "--max-total-tokens", "8192", "--context-length", "1024", "--sampling-backend", "pytorch",
          "--max-running-requests", "8", "--cuda-graph-max-bs-decode", "8",
          "--disable-prefill-cuda-graph", "--random-seed", "0", "--log-level", "warning")


@dataclass(frozen=True)
class Mode:
    name: str
    model: str  # GQA or MLA (a folder under the models directory)
    backend: str  # "triton" or "verify_attn"
    spec: Optional[str] = None  # a SPEC key; None: plain greedy decoding
    cuda_graph: bool = True
    extra: Tuple[str, ...] = field(default=())

    @property
    def greedy(self) -> str:
        return f"{self.model}_greedy_triton"

    @property
    def triton_twin(self) -> Optional[str]:
        if self.backend != "verify_attn":
            return None
        return f"{self.model}_{self.spec}_triton"

    def server_argv(self, models_dir: str, port: int) -> List[str]:
        argv = ["--model-path", f"{models_dir}/{self.model}", "--attention-backend", self.backend,
                "--port", str(port), "--nccl-port", str(port + 1), *COMMON]
        if self.spec is not None:
            flags, page = SPEC[self.spec]
            argv += [*flags, "--page-size", str(page)]
            if self.spec.startswith("eagle"):
                # verify_attn is no draft backend: name Triton for the draft model.
                argv += ["--speculative-draft-model-path", f"{models_dir}/{DRAFT}",
                         "--speculative-draft-attention-backend", "triton"]
        if not self.cuda_graph:
            argv.append("--disable-cuda-graph")
        return argv + list(self.extra)


def _modes() -> Dict[str, Mode]:
    out = []
    for model in (GQA, MLA):
        out.append(Mode(f"{model}_greedy_triton", model, "triton"))
        for spec in ("eagle", "ngram", "eaglechain", "ngramchain"):
            out.append(Mode(f"{model}_{spec}_triton", model, "triton", spec))
            out.append(Mode(f"{model}_{spec}_verify_attn", model, "verify_attn", spec))
            if spec in ("eagle", "ngram"):
                out.append(Mode(f"{model}_{spec}_verify_attn_eager", model, "verify_attn", spec, cuda_graph=False))
    return {m.name: m for m in out}


MODES: Dict[str, Mode] = _modes()


def default_order() -> List[str]:
    """All modes, the greedy references first, GQA before MLA, EAGLE on MLA last
    (its Llama-style draft on a DeepSeek target is the least certain start)."""
    names = list(MODES)
    key = lambda n: (0 if "_greedy_" in n else 1, n.startswith(MLA) and "eagle" in n, names.index(n))  # noqa: E731
    return sorted(names, key=key)
