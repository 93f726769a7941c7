"""A fix for a harness bug in SGLang 0.5.23's attention unit-test kit (tests only).

The kit's speculative CUDA-graph runner (``runner_modes/speculative_cuda_graph_runner.py``,
``run_speculative_cuda_graph_case``) first runs an eager leg on the *graph
fixture*: ``build_{dense,mla}_attention_fixture(..., runner_batch_size=4)``
fills ``req_to_token`` and the prefix K/V with the fixture's default
``loc_layout="shuffled_pages"`` slot map, then the leg calls
``adapter.prepare_inputs`` = ``prepare_{dense,mla}_runner_inputs``, which
re-writes the same prefix K/V through ``_populate_prefix_kv`` *without* a
``loc_fn``, i.e. at the contiguous ``_token_loc`` slots
``page_size + req * max_context_len + pos``. Both slot maps live in the same
per-request block, so wherever a shuffled slot of position ``q`` is a
contiguous slot ``j < prefix_len`` of the same request, the cache now holds
position ``j``'s K/V where ``req_to_token`` says ``q``'s is. Every backend that
reads the prefix through ``req_to_token`` (Triton's ``kv_indices`` included)
then attends over wrong prefix rows while the reference uses the right ones.
With the GPU test's cases (prefixes 5 and 37, context 128, the kit's seeds)
request 1 loses 10 (page_size 1) or 16 (MLA, page_size 16) prefix rows; only
the GQA page_size-16 permutations happen to leave every read slot intact,
which is exactly the pass/fail pattern of ``test_kit_target_verify_cuda_graph``.
The capture and replay legs are unaffected (their batches are built with the
contiguous map, so the rewrite lands where ``req_to_token`` points).

The fix: write the prefix K/V where the batch's ``req_to_token`` rows say it
lives (``req_to_token[req_pool_indices[r], pos]``), which is the kit's own
contiguous map for capture/replay batches and the shuffled map for the graph
fixture's batch. Nothing here imports SGLang at module import time.
"""


def req_to_token_loc_fn(runner, batch):
    """``(req_idx, pos) -> slot`` read from the batch's ``req_to_token`` rows (one host copy)."""
    rows = runner.req_to_token_pool.req_to_token.detach().to("cpu")
    pool_rows = batch.req_pool_indices.detach().to("cpu").tolist()

    def loc_fn(req_idx: int, pos: int) -> int:
        return int(rows[pool_rows[req_idx], pos])

    return loc_fn


def prepare_dense_runner_inputs(fixture, case, batch, inputs, *, max_context_len):
    """``dense_attention.prepare_dense_runner_inputs`` writing through ``req_to_token``."""
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention as dense

    dense._populate_prefix_kv(
        fixture.actual_module,
        case,
        fixture.runner,
        inputs["prefix_hidden"],
        max_context_len=max_context_len,
        loc_fn=req_to_token_loc_fn(fixture.runner, batch),
    )


def prepare_mla_runner_inputs(fixture, case, batch, inputs, *, max_context_len):
    """``mla_attention.prepare_mla_runner_inputs`` writing through ``req_to_token``."""
    from sglang.test.kits.attention_unittest.attention_methods import mla_attention as mla

    mla._populate_prefix_kv(
        fixture.actual_module,
        case,
        fixture.runner,
        fixture.backend,
        inputs["prefix_hidden"],
        max_context_len=max_context_len,
        loc_fn=req_to_token_loc_fn(fixture.runner, batch),
    )


def patch_target_verify_runner(monkeypatch, tv_module) -> None:
    """Make ``speculative_target_verify_runner``'s CUDA-graph cases use the fixed prepares
    (its ``run_*_cuda_graph_case`` look these names up in the module at call time)."""
    monkeypatch.setattr(tv_module, "prepare_dense_runner_inputs", prepare_dense_runner_inputs)
    monkeypatch.setattr(tv_module, "prepare_mla_runner_inputs", prepare_mla_runner_inputs)
