"""``--workload=real``: verify problems captured from a real model run.

The fixture format belongs to ``tools/bench/capture/fixture.py`` (written
separately); its loader ``load_fixture(path)`` is imported lazily, trying
``tools.bench.capture.fixture`` (repo root on ``sys.path``), ``capture.fixture``
(``tools/bench/`` on ``sys.path``) and finally the file
``tools/bench/capture/fixture.py`` itself with ``tools/bench/capture`` on
``sys.path`` (its siblings import each other as top-level modules). If none exists the bench says so and exits non-zero.

What this adapter reads from whatever ``load_fixture`` returns (a list of
cases, or an object/dict with ``cases``; every case a dict or an object):

- heads: ``num_qo_heads``/``heads``/``num_heads``, ``num_kv_heads``/``kv_heads``
  (default = heads), ``head_dim_qk``/``head_dim``, ``head_dim_vo`` (default =
  ``head_dim_qk``, or 512 for MLA); ``model`` ("mla"/"gqa", default: "mla" when
  ``head_dim_qk == 576`` and one KV head);
- lengths: ``q_lens`` (or ``qo_indptr``), ``prefix_lens`` (or ``seq_lens`` /
  ``kv_lens`` minus ``q_lens``); a single request may give ``q_len``/``prefix_len``;
- trees: ``parents`` (per request lists of local parent ids, -1 = root, or one
  flat list split by ``q_lens``; one DraftTree-like object with ``.parents``
  per request is accepted too); missing trees default to DDTree-like random ones;
- optional ``name``/``label``, ``dtype`` ("bf16"/"fp16").

Every case runs through our paged kernel and the baselines exactly like a grid
shape (random values; the captured structure: ragged lengths and real trees).
"""

import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Any, List, Optional

from .shapes import MLA_DQK, MLA_DVO, Shape


class FixtureUnavailable(RuntimeError):
    pass


def _bench_dir() -> str:
    """tools/bench/: the folder of benchlib/ and capture/."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_loader():
    """Return ``load_fixture`` or raise :class:`FixtureUnavailable`."""
    bench = _bench_dir()
    errors = []
    root = os.path.dirname(os.path.dirname(bench))
    for modname, path in (("tools.bench.capture.fixture", root), ("capture.fixture", bench)):
        added = False
        if path not in sys.path:
            sys.path.append(path)
            added = True
        try:
            mod = importlib.import_module(modname)
            return mod.load_fixture
        except Exception as e:  # noqa: BLE001
            errors.append(f"{modname}: {type(e).__name__}: {e}")
        finally:
            if added and path in sys.path:
                sys.path.remove(path)
    f = os.path.join(bench, "capture", "fixture.py")
    if os.path.isfile(f):
        cap = os.path.dirname(f)
        if cap not in sys.path:
            sys.path.insert(0, cap)
        try:
            spec = importlib.util.spec_from_file_location("verify_attn_capture_fixture", f)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod.load_fixture
        except Exception as e:  # noqa: BLE001
            errors.append(f"{f}: {type(e).__name__}: {e}")
    else:
        errors.append(f"{f}: missing")
    raise FixtureUnavailable("tools/bench/capture/fixture.py (load_fixture) is not available: " + "; ".join(errors))


def _get(c: Any, *names, default=None):
    for n in names:
        if isinstance(c, dict) and n in c:
            return c[n]
        if not isinstance(c, dict) and hasattr(c, n):
            return getattr(c, n)
    return default


def _ints(x) -> Optional[List[int]]:
    if x is None:
        return None
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (int,)):
        return [int(x)]
    return [int(v) for v in x]


def _parents(c, q_lens) -> Optional[tuple]:
    p = _get(c, "parents", "trees", "tree")
    if p is None:
        return None
    if hasattr(p, "parents"):
        p = [p]
    if hasattr(p, "tolist"):
        p = p.tolist()
    p = list(p)
    if p and all(hasattr(t, "parents") for t in p):
        p = [_ints(t.parents) for t in p]
    elif p and all(isinstance(v, (int,)) or hasattr(v, "item") for v in p):
        flat, out, i = [int(v) for v in p], [], 0
        for t in q_lens:
            out.append(flat[i:i + t])
            i += t
        p = out
    else:
        p = [_ints(t) for t in p]
    if [len(t) for t in p] != list(q_lens):
        raise ValueError(f"parents: lengths {[len(t) for t in p]} do not match q_lens {q_lens}")
    return tuple(tuple(t) for t in p)


def case_to_shape(c: Any, index: int = 0) -> Shape:
    heads = _get(c, "num_qo_heads", "heads", "num_heads", "n_head")
    q = _get(c, "q")
    kc = _get(c, "k_cache")
    if heads is None and q is not None and hasattr(q, "shape"):
        # tools/bench/capture Case: q [T, H, D], k_cache [pages, page_size, Hkv, D]
        heads = int(q.shape[1])
        if isinstance(c, dict):
            c = dict(c)
        else:
            c = dict(vars(c))
        c.setdefault("head_dim_qk", int(q.shape[2]))
        if kc is not None and hasattr(kc, "shape"):
            c.setdefault("num_kv_heads", int(kc.shape[-2]))
            c.setdefault("head_dim_vo", int(kc.shape[-1]))
        if "kv_len" in c and hasattr(c["kv_len"], "tolist") and "q_lens" in c:
            c.setdefault("kv_lens", c["kv_len"].tolist())
    if heads is None:
        raise ValueError("fixture case: no num_qo_heads/heads")
    heads = int(heads)
    kv_heads = int(_get(c, "num_kv_heads", "kv_heads", "n_kv_head", default=heads))
    d_qk = int(_get(c, "head_dim_qk", "head_dim", default=128))
    model = _get(c, "model")
    if model not in ("mla", "gqa"):
        model = "mla" if (d_qk == MLA_DQK and kv_heads == 1) else "gqa"
    d_vo = int(_get(c, "head_dim_vo", default=(MLA_DVO if model == "mla" else d_qk)))
    q_lens = _ints(_get(c, "q_lens"))
    if q_lens is None:
        ind = _ints(_get(c, "qo_indptr"))
        if ind is not None:
            q_lens = [ind[i + 1] - ind[i] for i in range(len(ind) - 1)]
        elif _get(c, "q_len") is not None:
            q_lens = [int(_get(c, "q_len"))]
    pre = _ints(_get(c, "prefix_lens"))
    if pre is None and _get(c, "prefix_len") is not None:
        pre = [int(_get(c, "prefix_len"))]
    if pre is None:
        kv = _ints(_get(c, "kv_lens", "seq_lens"))
        if kv is not None and q_lens is not None:
            pre = [a - b for a, b in zip(kv, q_lens)]
    if q_lens is None or pre is None:
        raise ValueError("fixture case: needs q_lens (or qo_indptr) and prefix_lens (or kv_lens)")
    parents = _parents(c, q_lens)
    label = _get(c, "name", "label")
    dtype = _get(c, "dtype", default="bf16")
    dtype = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(dtype), str(dtype))
    if dtype not in ("bf16", "fp16"):
        dtype = "bf16"
    shape = Shape(model, len(q_lens), heads, kv_heads, d_qk, d_vo, max(q_lens), max(pre),
                  "real" if parents is not None else "ddtree", ("real",), dtype,
                  q_lens=tuple(q_lens), prefix_lens=tuple(pre), parents=parents)
    name = str(label) if label else f"real#{index} {shape.name}"
    return dataclasses.replace(shape, label=name)


def load_shapes(path: Optional[str]) -> List[Shape]:
    if not path:
        try:
            path = _import_fixture_module().find_fixture()
        except ImportError as e:
            raise FixtureUnavailable(f"--workload=real: tools/bench/capture/fixture.py unavailable ({e})") from e
    if not path:
        raise FixtureUnavailable("--workload=real: no fixture (pass --fixture=PATH, set "
                                 "VERIFY_ATTN_REAL_FIXTURE, or run `bazel run //tools:capture`)")
    loader = import_loader()
    fx = loader(path)
    cases = _get(fx, "cases", default=fx)
    if isinstance(cases, dict):
        cases = list(cases.values())
    return [case_to_shape(c, i) for i, c in enumerate(list(cases))]


def _import_fixture_module():
    """tools/bench/capture/fixture.py as a module (its siblings import by plain names)."""
    cap = os.path.join(_bench_dir(), "capture")
    if cap not in sys.path:
        sys.path.insert(0, cap)
    return importlib.import_module("fixture")


def check_captured(path: Optional[str], device="cuda", page_sizes=(16, 1)) -> List[dict]:
    """Run our paged kernel on the captured tensors themselves and compare each
    case with its captured float64 reference; time it (CUDA events, median).

    Returns one row per (case, page_size): ``case``, ``page_size``, ``q_lens``,
    ``prefix_lens``, ``rel_err``, ``rel_err_max_req``, ``lse_abs_err``,
    ``median_us``, ``tflops``, ``ok`` (rel_err < 1e-2 and finite).
    """
    from . import timing

    fx = _import_fixture_module()
    path = path or fx.find_fixture()
    if not path:
        raise FixtureUnavailable("no fixture: run `bazel run //tools:capture` or set VERIFY_ATTN_REAL_FIXTURE")
    rows = []
    for ps in page_sizes:
        for c in fx.load_fixture(path, device=device, page_size=ps):
            out, lse = fx.run_kernel(c)
            err = fx.compare(out, lse, c)
            t = timing.time_eager([lambda c=c: fx.run_kernel(c)], device, target_ms=50.0)
            rows.append(dict(case=c.name, page_size=c.page_size, q_lens=c.q_lens,
                             prefix_lens=c.prefix_lens, median_us=t.median_us,
                             tflops=c.flops() / (t.median_us * 1e-6) / 1e12,
                             ok=err["rel_err"] < 1e-2 and err.get("lse_abs_err", 0) < 1e-2,
                             **err))
    return rows
