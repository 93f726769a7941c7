"""verify_attn benchmark: the product's main job (`bazel run //tools:bench`).

Runs a grid of tree-verify shapes (every row of DESIGN.md §2, GQA, DDTree-like
budgets; ``--grid``, ``--shapes``) through, in one process and one run:

- this project: the flat and the paged kernel, eager and CUDA-graph replay
  (``--compare_configs=tag,...`` adds the paged kernel with those configurations
  forced, as columns ``@tag``: an A/B of kernel variants within one process;
  ``--kv_dtype=fp8_e4m3`` the paged kernel on an fp8 copy of the caches,
  column ``@fp8``);
- SGLang 0.5.23's Triton kernels (staged by ``tools/bench/fetch_baselines.sh``):
  ``extend_attention_fwd`` with the FULL tree mask, and for chains
  ``verify_shared_kv_fwd``;
- FlashInfer's custom-mask paged prefill (GQA; not stageable on the lent H200,
  see ``benchlib/baselines/flashinfer.py``: the column says why);
- PyTorch FlexAttention (``torch.compile``d, tree ``mask_mod``, block mask);
- FlashMLA (``sgl-flash-mla``, dense bf16 decode, ``causal=True``, page block
  64; SM90 only; its wheel staged on request by ``VERIFY_ATTN_STAGE_FLASHMLA=1
  tools/bench/fetch_baselines.sh``, else the column says "unavailable"): no tree
  mask, so it runs the causal CHAIN of every MLA row's shape, tree rows too,
  checked against that chain's reference (``benchlib/baselines/flashmla.py``);
- the float64 PyTorch reference, as the correctness check;
- opt-in (``--baselines=...,sglang_backend``, needs SGLang installed: see
  ``--sglang_site``): SGLang's attention backends themselves, our plugin
  backend and ``TritonAttnBackend``, timing ``forward_extend`` in target verify
  (eager), so the integration's overhead over the bare kernel is visible
  (``benchlib/baselines/sglang_backend.py``).

Every output is checked before it is timed. Per shape: median microseconds,
TFLOP/s, KV GB/s, fractions of the floor (DESIGN.md §3, against a device copy
and a bf16 matmul measured in the same run), the speedup over each baseline,
the max relative error. Output: tables on stdout, JSON (``--json_out``), a PNG
(``--plot_out``), a progress bar on stderr.

Without a CUDA device it says so on stderr and exits with status 2.
``--dry_run`` runs the whole pipeline on the CPU with tiny shapes and the
PyTorch reference only (CI).
"""

import os
import sys
import time

# benchlib/ and capture/ sit beside this file (tools/bench/): importable when it
# runs as a plain script (`python3 tools/bench/bench.py`) as under Bazel.
_HERE = os.path.dirname(os.path.realpath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("grid", "quick", ["quick", "full"], "Shape grid: quick (~3-4 min on an H200) or full.")
flags.DEFINE_string("shapes", None, "Keep shapes whose name contains any of these comma-separated "
                    "substrings (case-insensitive), e.g. 'mla B1 ,gqa B16'.")
flags.DEFINE_bool("list", False, "Print the selected shapes and exit (no GPU needed).")
flags.DEFINE_string("json_out", None, "JSON results path (default: $OUT/bench.json when $OUT is set, "
                    "else verify_attn_bench.json in the working directory). Rewritten after every shape.")
flags.DEFINE_string("plot_out", None, "PNG plot path (default: beside the JSON, .png).")
flags.DEFINE_integer("page_size", 1, "Page size of the paged cache (1 like SGLang's token pool; 64 option).")
flags.DEFINE_integer("slot_runs", 1, "With --page_size=1: each request's token slots in runs of this many "
                     "consecutive slots (SGLang's token slots of a --page-size N pool); 1 scatters every slot.")
flags.DEFINE_bool("hint_slot_runs", True, "Pass --slot_runs to verify_attn as its kv_slot_runs hint (as the "
                  "SGLang plugin passes its --page-size); false: the same slots without the hint.")
flags.DEFINE_integer("kv_slot_runs_hint", None, "Tuning only: pass this kv_slot_runs hint whatever the slots are "
                     "(e.g. 64 with --slot_runs=1: the rows kernel gathering every tile, a hint that does not "
                     "hold; 0 or 1: no hint); default: --slot_runs as --hint_slot_runs says.")
flags.DEFINE_string("baselines_dir", None, "Staged SGLang kernels and FlashMLA wheel (tools/bench/fetch_baselines.sh); "
                    "default <repo>/.gpu_stage/baselines.")
# Every name --baselines accepts (build_impls maps each to its adapters).
KNOWN_BASELINES = ("sglang_extend", "sglang_chain", "flex", "flashinfer", "flashmla", "sdpa_flash", "sglang_backend")
flags.DEFINE_list("baselines", ["sglang_extend", "sglang_chain", "flex", "flashinfer", "flashmla", "sdpa_flash"],
                  "Baselines to run: sglang_extend, sglang_chain, flex, flashinfer, flashmla (FlashMLA's "
                  "dense decode with causal=True: the causal chain of every MLA row, tree rows too; "
                  "'unavailable' unless its wheel is staged, VERIFY_ATTN_STAGE_FLASHMLA=1 "
                  "tools/bench/fetch_baselines.sh, and the GPU is SM90), sdpa_flash (torch's "
                  "FlashAttention-2 on the dense unmasked problem of each GQA row, flat KV), and (not by default: "
                  "needs SGLang installed, see --sglang_site) sglang_backend = our SGLang plugin backend "
                  "and SGLang's TritonAttnBackend, forward_extend in target verify (eager).")
flags.DEFINE_string("sglang_site", None, "Folder with SGLang installed (integration/sglang/run_gpu_bench.sh "
                    "makes one from .gpu_stage/sglang), put first on sys.path for --baselines=sglang_backend; "
                    "default $VERIFY_ATTN_SGLANG_SITE, else an SGLang already importable.")
flags.DEFINE_enum("flex", "auto", ["auto", "all", "none"],
                  "FlexAttention shapes: auto = those tagged 'flex' (bounds torch.compile time), all, none.")
flags.DEFINE_list("compare_configs", [],
                  "Also time the paged kernel with each of these configurations forced "
                  "(verify_attn.Tuning(config=...) tags, e.g. mla_m32n32_s1; an unknown tag is a "
                  "usage error), in the same process as "
                  "columns '@<tag>': an A/B of kernel variants without run-to-run drift. The JSON records "
                  "the configuration each really ran (plan), which is the default one where the plan "
                  "refuses the forced tag for a shape.")
flags.DEFINE_enum("kv_dtype", "", ["", "fp8_e4m3"],
                  "fp8_e4m3: also run our paged kernel on an fp8 (e4m3) copy of each row's caches (GQA / MHA "
                  "and MLA; column ours_paged@fp8, with --sm120 also ours_paged@fp8_sm120; "
                  "per-tensor scales amax / 448; its error is against the q-dtype cache's float64 result, "
                  "quantization included). '': the cache in q's dtype only.")
flags.DEFINE_list("compare_balance", [],
                  "Also run our paged kernel with balanced splits forced: 'on' (the batch's split CTAs shared by "
                  "KV length wherever the kernel can, Tuning(balance_splits=True): column ours_paged@balanced), "
                  "'off' (every request split num_splits ways, Tuning(balance_splits=False): ours_paged@unbalanced).")
flags.DEFINE_bool("compare_pair", False,
                  "Also run our paged kernel with the pair of splits off (Tuning(pair_splits=False): two splits "
                  "write fp32 partial rows for the merge kernel instead of combining in a thread-block cluster; "
                  "column ours_paged@no_pair).")
flags.DEFINE_bool("sm120", False, "Also run our paged kernel planned as on sm_120 (the column ours_paged@sm120: "
                  "shared memory capped at 101,376 bytes per block, the configurations an RTX PRO 6000 "
                  "runs, on this card's SMs), with the mma.sync ceiling beside it.")
flags.DEFINE_string("mma_peak_bin", None, "The mma.sync ceiling binary (tools/bench/ceilings:mma_peak); "
                    "default <repo>/.gpu_stage/mma_peak when it exists. Its rate is reported as the mma.sync "
                    "ceiling and every row's %mma.")
flags.DEFINE_integer("num_splits", 0, "Tuning only: our kernels' split-K count forced to this (the API's "
                     "num_splits; 0 = the plan's choice), e.g. an A/B of two counts on one shape with "
                     "tools/dev/ab_bench.sh's AB_ARGS_B. The JSON's plan records the count that ran.")
flags.DEFINE_bool("graph", True, "Also time CUDA-graph replay.")
flags.DEFINE_bool("rotate", True, "Rotate among several input sets when one would stay in L2.")
flags.DEFINE_integer("warmup", 3, "Warm-up calls per input set before timing (>= 0).")
flags.DEFINE_float("target_ms", 150.0, "Timed work per implementation and mode (sets the call count; > 0).")
flags.DEFINE_integer("min_iters", 5, "Fewest timed calls (>= 1, <= --max_iters).")
flags.DEFINE_integer("max_iters", 200, "Most timed calls.")
flags.DEFINE_integer("timing_rounds", 1, "Timing rounds per shape (>= 1): rounds after the first time every "
                     "implementation again, in reversed order every other round, and each figure is the "
                     "median over rounds (the GPU clock drifts with power and temperature over seconds; "
                     "one pass in a fixed order can favour the first implementation).")
flags.DEFINE_integer("seed", 0, "Seed of the random trees, page tables and values.")
flags.DEFINE_float("time_budget_s", None, "Stop starting new shapes after this many seconds (> 0; unset = "
                   "no limit); the rest are listed as skipped.")
flags.DEFINE_bool("measure_ceilings", True, "Measure the copy and matmul ceilings (else nominal H200 figures).")
flags.DEFINE_enum("workload", "synthetic", ["synthetic", "real"],
                  "synthetic: the shape grid; real: the cases of --fixture (tools/bench/capture/fixture.py).")
flags.DEFINE_string("fixture", None, "Fixture path for --workload=real.")
flags.DEFINE_bool("dry_run", False, "CPU only: tiny shapes, the PyTorch reference only (exercises the pipeline).")
flags.DEFINE_bool("progress", True, "Progress bar on stderr.")


def gpu_and_toolchain():
    """Return a dict describing the device and this build, or raise RuntimeError."""
    import torch

    import verify_attn

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible to torch (torch %s)" % torch.__version__)
    try:
        info = verify_attn.runtime_info()
    except Exception as e:  # noqa: BLE001
        raise RuntimeError("verify_attn's extension could not be loaded: %s" % e) from e
    props = torch.cuda.get_device_properties(0)
    info.update({
        "device": props.name,
        "capability": "sm_%d%d" % (props.major, props.minor),
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    })
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = "not installed"
    return info


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(_HERE))


def default_paths():
    out = os.environ.get("OUT")
    if out:
        base = os.path.join(out, "bench")
    else:
        cwd = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
        base = os.path.join(cwd, "verify_attn_bench")
    json_out = FLAGS.json_out or base + ".json"
    plot_out = FLAGS.plot_out or os.path.splitext(json_out)[0] + ".png"
    return json_out, plot_out


def kv_slot_runs_hint():
    """The kv_slot_runs hint the bench gives verify_attn (benchlib.inputs.build_case):
    --kv_slot_runs_hint when set, else --slot_runs (None) or none (1) as --hint_slot_runs says."""
    if FLAGS.kv_slot_runs_hint is not None:
        return FLAGS.kv_slot_runs_hint
    return None if FLAGS.hint_slot_runs else 1


def flag_errors():
    """Usage errors in the flags, each naming its flag (checked before anything is
    measured or the GPU is touched); empty when they are consistent."""
    errs = []
    if FLAGS.page_size < 1:
        errs.append(f"--page_size: must be >= 1 (got {FLAGS.page_size})")
    if FLAGS.slot_runs < 1 or (FLAGS.slot_runs > 1 and FLAGS.page_size != 1):
        errs.append(f"--slot_runs: must be >= 1, and 1 unless --page_size=1 (got {FLAGS.slot_runs})")
    hint = FLAGS.kv_slot_runs_hint
    if hint is not None and (hint < 0 or (hint > 1 and FLAGS.page_size != 1)):
        errs.append(f"--kv_slot_runs_hint: must be >= 0 (0 or 1: no hint), and <= 1 unless --page_size=1 "
                    f"(got {hint})")
    if FLAGS.time_budget_s is not None and not FLAGS.time_budget_s > 0:
        errs.append(f"--time_budget_s: must be > 0 seconds, or left unset for no limit (got {FLAGS.time_budget_s:g})")
    if FLAGS.warmup < 0:
        errs.append(f"--warmup: must be >= 0 (got {FLAGS.warmup})")
    if not FLAGS.target_ms > 0:  # NaN too
        errs.append(f"--target_ms: must be > 0 (got {FLAGS.target_ms:g})")
    if FLAGS.timing_rounds < 1:
        errs.append(f"--timing_rounds: must be >= 1 (got {FLAGS.timing_rounds})")
    if not 0 <= FLAGS.num_splits <= 65535:
        errs.append(f"--num_splits: must be in [0, 65535] (got {FLAGS.num_splits})")
    if FLAGS.min_iters < 1:
        errs.append(f"--min_iters: must be >= 1 (got {FLAGS.min_iters})")
    elif FLAGS.min_iters > FLAGS.max_iters:
        errs.append(f"--min_iters: must be <= --max_iters (got {FLAGS.min_iters} > {FLAGS.max_iters})")
    unknown = [b for b in FLAGS.baselines if b not in KNOWN_BASELINES]
    if unknown:
        errs.append(f"--baselines: unknown {', '.join(map(repr, unknown))}; expected some of "
                    f"{', '.join(KNOWN_BASELINES)}")
    bad = [m for m in FLAGS.compare_balance if m not in ("on", "off")]
    if bad or len(set(FLAGS.compare_balance)) != len(FLAGS.compare_balance):
        errs.append(f"--compare_balance: 'on' and / or 'off', each once (got {','.join(FLAGS.compare_balance)})")
    if FLAGS.compare_configs:
        try:  # the plan's own list (C-ABI va_config_tags); the extension loads without a GPU
            import verify_attn

            known = verify_attn.runtime_info()["config_tags"]
        except Exception as e:  # noqa: BLE001
            errs.append(f"--compare_configs: cannot check the tags, verify_attn's extension did not load ({e})")
        else:
            unknown = [c for c in FLAGS.compare_configs if c not in known]
            if unknown:
                errs.append(f"--compare_configs: unknown {', '.join(map(repr, unknown))}; expected some of "
                            f"{', '.join(known)}")
    return errs


def select_shapes():
    from benchlib import shapes as shapes_mod
    from benchlib import workload

    if FLAGS.dry_run and FLAGS.workload == "real":
        raise ValueError("--dry_run runs the synthetic dry grid; it does not combine with --workload=real")
    if FLAGS.dry_run:
        sel = shapes_mod.dry_grid()
        grid_name = "dry"
    elif FLAGS.workload == "real":
        sel = workload.load_shapes(FLAGS.fixture)
        grid_name = "real"
    else:
        sel = shapes_mod.grid(FLAGS.grid)
        grid_name = FLAGS.grid
    return shapes_mod.filter_shapes(sel, FLAGS.shapes), grid_name


def sglang_site():
    return FLAGS.sglang_site or os.environ.get("VERIFY_ATTN_SGLANG_SITE") or None


def build_impls(dry_run: bool, baselines_dir: str):
    from benchlib import ours
    from benchlib.baselines import flashinfer, flashmla, flex, sdpa, sglang_backend, sglang_triton, torch_ref

    if dry_run:
        return [torch_ref.TorchReference()]
    ns = FLAGS.num_splits
    impls = [ours.OursPaged(num_splits=ns)] + [
        ours.OursPaged(force_config=c, num_splits=ns) for c in FLAGS.compare_configs]
    if FLAGS.sm120:
        impls.append(ours.OursPaged(num_splits=ns, max_smem_bytes=ours.SM120_SMEM_BYTES, tag="sm120"))
    for mode in FLAGS.compare_balance:
        on = {"on": True, "off": False}[mode]
        impls.append(ours.OursPaged(num_splits=ns, tag="balanced" if on else "unbalanced", balance_splits=on))
    if FLAGS.compare_pair:
        impls.append(ours.OursPaged(num_splits=ns, tag="no_pair", pair_splits=False))
    if FLAGS.kv_dtype == "fp8_e4m3":
        impls.append(ours.OursPagedFp8(num_splits=ns))
        if FLAGS.sm120:
            impls.append(ours.OursPagedFp8(num_splits=ns, max_smem_bytes=ours.SM120_SMEM_BYTES, tag="sm120"))
    impls.append(ours.OursFlat(num_splits=ns))
    known = {
        "sglang_extend": lambda: [sglang_triton.SGLangExtend(baselines_dir)],
        "sglang_chain": lambda: [sglang_triton.SGLangChain(baselines_dir)],
        "flex": lambda: [flex.Flex()],
        "flashinfer": lambda: [flashinfer.FlashInferPrefill()],
        "flashmla": lambda: [flashmla.FlashMLAChain(baselines_dir)],
        "sdpa_flash": lambda: [sdpa.SdpaFlashDense()],
        "sglang_backend": lambda: sglang_backend.adapters(sglang_site()),
    }
    last = []
    assert set(known) == set(KNOWN_BASELINES)
    for name in FLAGS.baselines:
        if name not in known:
            raise app.UsageError(f"--baselines: unknown {name!r}; expected some of {', '.join(KNOWN_BASELINES)}")
        # The SGLang backends import the real SGLang after sglang_triton has
        # loaded its staged kernels (see sglang_backend's docstring): last.
        (last if name == "sglang_backend" else impls).extend(known[name]())
        if name == "sglang_extend" and FLAGS.kv_dtype == "fp8_e4m3":
            impls.append(sglang_triton.SGLangExtendFp8(baselines_dir))
    return impls + last


def main(argv):
    del argv
    errs = flag_errors()
    if errs:
        for e in errs:
            print(f"verify_attn bench: {e}", file=sys.stderr)
        return 2
    try:
        selected, grid_name = select_shapes()
    except Exception as e:  # noqa: BLE001
        print(f"verify_attn bench: {e}", file=sys.stderr)
        return 2
    if not selected:  # with --list too: a filter that matches nothing is a usage error
        print(f"verify_attn bench: no shape matches --shapes={FLAGS.shapes!r}", file=sys.stderr)
        return 2
    if FLAGS.list:
        for s in selected:
            print(s.name + ("  [" + ",".join(s.tags) + "]" if s.tags else ""))
        print(f"{len(selected)} shapes", file=sys.stderr)
        return 0

    from benchlib import floor, report, runner

    if FLAGS.dry_run:
        import torch

        import verify_attn

        info = {"device": "cpu (dry run: PyTorch reference only, nothing of ours measured)",
                "torch": torch.__version__, "verify_attn": getattr(verify_attn, "__version__", "?")}
        device = "cpu"
        ceil = floor.nominal_ceilings("dry run: nominal H200 figures from DESIGN.md §2, not measured")
    else:
        try:
            info = gpu_and_toolchain()
        except RuntimeError as e:
            if "no CUDA device" in str(e):
                print("verify_attn bench: %s. The benchmark needs an NVIDIA GPU "
                      "(sm_90 or sm_120); nothing was measured. (--dry_run exercises "
                      "the pipeline on the CPU.)" % e, file=sys.stderr)
            else:
                print("verify_attn bench: %s; nothing was measured." % e, file=sys.stderr)
            return 2
        device = "cuda"
        if FLAGS.measure_ceilings:
            ceil = floor.measure_ceilings(device)
        else:
            ceil = floor.nominal_ceilings()
            ceil.device = info.get("device", "?")
        mma_bin = FLAGS.mma_peak_bin or os.path.join(repo_root(), ".gpu_stage", "mma_peak")
        if FLAGS.mma_peak_bin or FLAGS.sm120 or os.path.isfile(mma_bin):
            ceil.mma_sync_flop_per_s, why = floor.measure_mma_sync(mma_bin)
            if why:
                ceil.note = (ceil.note + "; " if ceil.note else "") + f"mma.sync ceiling not measured: {why}"

    baselines_dir = FLAGS.baselines_dir or os.path.join(repo_root(), ".gpu_stage", "baselines")
    impls = build_impls(FLAGS.dry_run, baselines_dir)
    opts = runner.Options(
        device=device, page_size=FLAGS.page_size, slot_runs=FLAGS.slot_runs,
        kv_slot_runs_hint=kv_slot_runs_hint(), seed=FLAGS.seed,
        graph=FLAGS.graph and not FLAGS.dry_run, rotate=FLAGS.rotate, warmup=FLAGS.warmup,
        target_ms=FLAGS.target_ms if not FLAGS.dry_run else min(FLAGS.target_ms, 20.0),
        min_iters=FLAGS.min_iters if not FLAGS.dry_run else 2,
        max_iters=FLAGS.max_iters if not FLAGS.dry_run else 5,
        flex_policy=FLAGS.flex, grid_name=grid_name, rounds=FLAGS.timing_rounds)
    json_out, plot_out = default_paths()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    header = {
        "card": info.get("device"),
        "ceilings": (f"copy {ceil.copy_bytes_per_s / 1e12:.2f} TB/s (read+write), "
                     f"bf16 matmul {ceil.matmul_flop_per_s / 1e12:.0f} TFLOP/s "
                     f"({'measured in this run' if ceil.measured else ceil.note})"
                     + (f", mma.sync {ceil.mma_sync_flop_per_s / 1e12:.0f} TFLOP/s (register-only m16n8k16, "
                        f"measured in this run)" if ceil.mma_sync_flop_per_s else "")
                     + (f"; {ceil.note}" if ceil.measured and ceil.note else "")),
        "grid": f"{grid_name}, {len(selected)} shapes, page_size {FLAGS.page_size}"
                + (f" (slots in runs of {FLAGS.slot_runs})" if FLAGS.slot_runs > 1 else "") + ", dtype bf16",
        "baselines dir": baselines_dir,
    }
    if any(i.name.startswith("sglang_backend") for i in impls):
        header["sglang site"] = sglang_site() or "(none given: an SGLang already on sys.path)"

    def payload(rows, finished=None):
        for r in rows:
            ratios = report.integration_ratios(r)
            if ratios:
                r["sglang_backend"] = ratios
        return {
            "bench": "verify_attn", "started": started, "finished": finished,
            "device": info, "ceilings": ceil.as_dict(), "conventions": report.CONVENTIONS,
            "options": {"grid": grid_name, "shapes": FLAGS.shapes, "page_size": FLAGS.page_size,
                        "slot_runs": FLAGS.slot_runs, "hint_slot_runs": FLAGS.hint_slot_runs,
                        "kv_slot_runs_hint": FLAGS.kv_slot_runs_hint,
                        "baselines": [i.name for i in impls], "flex": FLAGS.flex, "graph": opts.graph,
                        "rotate": opts.rotate, "rounds": opts.rounds, "seed": FLAGS.seed, "dry_run": FLAGS.dry_run,
                        "workload": FLAGS.workload, "fixture": FLAGS.fixture,
                        "baselines_dir": baselines_dir, "sglang_site": sglang_site()},
            "rows": rows,
            "captured": captured,
        }

    def on_row(rows):
        try:
            report.write_json(json_out, payload(rows))
        except Exception as e:  # noqa: BLE001
            print(f"verify_attn bench: could not write {json_out}: {e}", file=sys.stderr)

    captured = []
    if FLAGS.workload == "real" and not FLAGS.dry_run:
        # First the captured tensors themselves against their float64 reference.
        from benchlib import workload
        from tabulate import tabulate

        captured = workload.check_captured(FLAGS.fixture, device=device)
        print("Captured real inputs (SmolLM2-135M, tools/bench/capture): our paged kernel vs the "
              "captured float64 reference")
        print(tabulate([[r["case"], r["page_size"], "/".join(map(str, r["q_lens"])),
                         "/".join(map(str, r["prefix_lens"])), f"{r['median_us']:.1f}",
                         f"{r['rel_err']:.1e}", f"{r['rel_err_max_req']:.1e}",
                         f"{r.get('lse_abs_err', float('nan')):.1e}", "ok" if r["ok"] else "FAIL"]
                        for r in captured],
                       headers=["case", "page", "q_len", "prefix", "us (eager)", "rel err",
                                "worst req", "lse err", ""], tablefmt="github"))
        print()
    prog = report.Progress(len(selected), enabled=FLAGS.progress)
    try:
        rows = runner.run_all(selected, impls, opts, ceil, on_row=on_row, progress=prog,
                              time_budget_s=FLAGS.time_budget_s or 0.0)
    finally:
        prog.close()
    report.write_json(json_out, payload(rows, finished=time.strftime("%Y-%m-%d %H:%M:%S")))
    print(report.render(rows, header))
    try:
        p = report.plot(rows, plot_out, title=f"verify_attn on {info.get('device')} ({grid_name} grid)")
    except Exception as e:  # noqa: BLE001
        p = None
        print(f"verify_attn bench: plot failed: {e}", file=sys.stderr)
    print(f"\nJSON: {json_out}" + (f"\nPNG:  {p}" if p else ""))
    bad = [r for r in rows if r.get("error") and not str(r["error"]).startswith("skipped")]
    ours_bad = [r for r in rows for k in ("ours_paged", "ours_flat")
                if (r.get("impls") or {}).get(k, {}).get("status") in ("failed", "wrong")]
    # our SGLang backend computing a wrong output is ours too (its failures may be the SGLang install's)
    ours_bad += [r for r in rows if (r.get("impls") or {}).get("sglang_backend_ours", {}).get("status") == "wrong"]
    captured_bad = [r for r in captured if not r["ok"]]
    return 1 if (bad or ours_bad or captured_bad) else 0


if __name__ == "__main__":
    app.run(main)
