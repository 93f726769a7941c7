"""One Engine check mode: an ``sglang.Engine`` (scheduler and workers, no HTTP
front), greedy, token ids in and out; writes ``OUT_DIR/<mode>.json``.

    python run_mode.py MODE MODELS_DIR OUT_DIR PORT

The JSON holds the mode, its server arguments, the output token ids per request,
the per-request ``meta_info`` speculative fields, the greedy reference's top-2
logprobs per token (to tell a bf16 near-tie from a real difference), the
verify_attn counts of every process (``va_engine_probe``) and the seconds it
took; on failure, the error and the traceback's last lines instead.
"""

import glob
import json
import os
import random
import sys
import time
import traceback

MAX_NEW_TOKENS = 48


def prompts():
    """Six requests: three that repeat a phrase (NGRAM drafts from them), three random."""
    rng = random.Random(7)
    out = [[(3 + 5 * i + j) % 2000 + 2 for j in range(16)] * 3 for i in range(3)]
    out += [[rng.randrange(2, 2000) for _ in range(24 + 20 * i)] for i in range(3)]
    return out


def merge_counts(files):
    """Sum the per-process probe files (numbers added, kernel tallies merged)."""
    total = {"verify_steps": 0, "graph_verify_steps": 0, "layer_calls": 0, "plans": 0, "kernels": {}}
    for path in files:
        with open(path) as f:
            one = json.load(f)
        for k, v in one.items():
            if k == "kernels":
                for name, n in v.items():
                    total["kernels"][name] = total["kernels"].get(name, 0) + n
            else:
                total[k] = total.get(k, 0) + v
    return total


def main(mode_name: str, models: str, out_dir: str, port: int) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from modes import MODES  # noqa: PLC0415

    mode = MODES[mode_name]
    counts_dir = os.path.join(out_dir, "counts", mode_name)
    os.environ["VA_ENGINE_COUNTS"] = counts_dir  # read by va_engine_probe in every SGLang process
    argv = mode.server_argv(models, port)
    rec = {"mode": mode_name, "argv": argv}
    t0 = time.time()
    try:
        import sglang  # noqa: PLC0415
        from sglang.srt.plugins import load_plugins  # noqa: PLC0415

        load_plugins()  # the backend name must be a CLI choice before the arguments are parsed
        from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415

        engine = sglang.Engine(server_args=prepare_server_args(argv))
        rec["start_seconds"] = round(time.time() - t0, 1)
        reference = mode.spec is None
        try:
            res = engine.generate(input_ids=prompts(),
                                  sampling_params={"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS,
                                                   "ignore_eos": True},
                                  return_logprob=reference, top_logprobs_num=2 if reference else None)
        finally:
            engine.shutdown()
        rec["outputs"] = [r["output_ids"] for r in res]
        rec["meta"] = [{k: v for k, v in r["meta_info"].items()
                        if k.startswith("spec_") or k in ("completion_tokens", "prompt_tokens")} for r in res]
        if reference:
            rec["top2"] = [[[[float(lp), int(tok)] for lp, tok, *_ in (pos or [])[:2]]
                            for pos in r["meta_info"].get("output_top_logprobs") or []] for r in res]
    except BaseException as e:  # noqa: BLE001 - the record says what stopped this mode
        rec["error"] = f"{type(e).__name__}: {e}"[:2000]
        rec["traceback"] = traceback.format_exc()[-6000:]
    rec["seconds"] = round(time.time() - t0, 1)
    rec["counts"] = merge_counts(sorted(glob.glob(os.path.join(counts_dir, "*.json"))))
    with open(os.path.join(out_dir, f"{mode_name}.json"), "w") as f:
        json.dump(rec, f)
    print(mode_name, "error: " + rec["error"] if "error" in rec else "ok", f"{rec['seconds']} s", flush=True)
    return 1 if "error" in rec else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
