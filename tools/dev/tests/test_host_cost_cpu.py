"""CPU test of tools/dev/host_cost.py: the fake mode times the whole Python path of
an eager call (validation, dispatch, parameters) against a stub extension and
puts every stubbed name back afterwards."""


import pytest
import torch

from verify_attn import attention, errors


def test_fake_mode_times_the_python_path_and_restores(capsys, load_tool):
    tool = load_tool("host_cost")
    tool.FLAGS(["host_cost", "--mode=fake", "--calls=3", "--rounds=2", "--batch=2", "--prefix=40"])
    before = (attention._load_C, attention._check_devices, errors.error_word_ptr, torch.cuda.device,
              torch.cuda.current_stream, hasattr(torch._C, "_cuda_getCurrentRawStream"))
    tool.main([])
    after = (attention._load_C, attention._check_devices, errors.error_word_ptr, torch.cuda.device,
             torch.cuda.current_stream, hasattr(torch._C, "_cuda_getCurrentRawStream"))
    assert after == before, "stubs left installed"
    out = capsys.readouterr().out
    for name in ("oneshot", "run", "newplan"):
        line = [l for l in out.splitlines() if l.strip().startswith(f"fake {name}")]
        assert line, out
        us = float(line[0].split(":")[1].split()[0])
        assert 0.0 < us < 1e6, line[0]


def test_stub_call_really_runs_validation(load_tool):
    """The stubbed call still validates: a bad sm_scale is refused, naming it."""
    tool = load_tool("host_cost")
    tool.FLAGS(["host_cost", "--mode=fake", "--calls=1", "--rounds=1", "--batch=2", "--prefix=40"])
    undo = tool.stubbed()
    try:
        oneshot, run, newplan, _ = tool.make_calls("cpu")
        oneshot()  # passes with the stub extension
        run()
        newplan()
        import verify_attn
        with pytest.raises(TypeError, match="^sm_scale"):
            verify_attn.tree_attention_paged(
                torch.zeros(4, 16, 576, dtype=torch.bfloat16), torch.zeros(10, 1, 1, 576, dtype=torch.bfloat16),
                None, torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32),
                torch.arange(5, dtype=torch.int32), torch.tensor([5], dtype=torch.int32), causal=True,
                sm_scale="abc", max_q_len=4, max_kv_len=5)
    finally:
        undo()
