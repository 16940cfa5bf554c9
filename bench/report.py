"""Machine details and the RESULTS.md writer: one table per workload with the targets and
PASS/MISS, qrun's time split, and the model speed options."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.engine_sections import corpus_section, maskbench_section

WORKLOAD_ORDER = ("rpg", "longdoc", "batch", "regex")


def machine(backend: Any | None = None) -> dict[str, Any]:
    """CPU, cores, torch threads, versions, dtype, load: what the figures depend on."""
    # Here, not at the top: the torch-free benchmarks (bench/maskbench.py) write RESULTS.md.
    import torch
    import transformers

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "commit": _commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if backend is not None:
        cache = getattr(backend, "prefix_cache", None)
        info.update(model=backend.name, dtype=backend.dtype, device=backend.device,
                    attn=getattr(backend.model.config, "_attn_implementation", None),
                    prefix_cache_mb=None if cache is None else cache.budget_bytes >> 20)
    return info


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _commit() -> str:
    """HEAD's short hash, plus a mark when qrun/ has uncommitted changes (read-only git)."""
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "qrun"],
                               capture_output=True, text=True, timeout=10,
                               cwd=here.parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" + uncommitted changes in qrun/" if dirty else "")


# --- markdown ---------------------------------------------------------------------------------


def write_results(results: Mapping[str, Any], path: Path) -> None:
    path.write_text(render(results), encoding="utf-8")


def render(results: Mapping[str, Any]) -> str:
    m = results.get("machine", {})
    lines = [
        "# qrun benchmark results",
        "",
        "Written by `python -m bench` (see bench/README.md for what each figure means). Each "
        "workload is measured in one process, one after another: qrun, then the **ideal** "
        "(qrun's final token ids replayed through the bare model, one forward per stretch "
        "between model decisions), then the **naive** baseline (`model.generate` per hole on "
        "the re-tokenized text so far). Every measurement follows one warm-up that is not "
        "counted; qrun and the ideal replays are timed in `--repeat` passes (default 2, order "
        "alternated), the naive baseline in `--naive-repeat` (default 1), and the fastest pass "
        "of each is kept. Greedy decoding throughout.",
        "",
        "## Machine",
        "",
        f"- CPU: {m.get('cpu')} ({m.get('cores')} cores, {m.get('cpu_capability')}); "
        f"torch threads {m.get('torch_threads')} (inter-op {m.get('torch_interop_threads')})",
        f"- {m.get('platform')}; Python {m.get('python')}, torch {m.get('torch')}, "
        f"transformers {m.get('transformers')}",
        f"- model {m.get('model')} ({m.get('dtype')}, {m.get('device')}, attention "
        f"{m.get('attn')}, prefix cache {m.get('prefix_cache_mb')} MB, emptied before "
        f"every timed qrun pass); commit {m.get('commit')}; {m.get('date')}",
        f"- load average at start: {m.get('load_avg')}. **The machine is shared**: other "
        "engineers run tests on it at the same time, so timings are noisy (±30 % and "
        "occasional several-fold outliers); each workload lists the load average before and "
        "after it.",
        "",
        "## Summary",
        "",
        "| workload | context | forward/context | qrun s | ideal s | naive s | qrun/ideal | "
        "without speculation s | its /ideal | naive/qrun | targets |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def summary_line(name: str, row: Mapping[str, Any]) -> str:
        verdicts = ", ".join(f"{t['name']} {'PASS' if t['pass'] else 'MISS'}"
                             for t in row["targets"])
        return (
            f"| {name} | {row['context_tokens']} | {row['forward_over_context']:.3f} | "
            f"{row['qrun']['wall_s']:.2f} | {row['ideal']['wall_s']:.2f} | "
            f"{row['naive']['wall_s']:.2f} | {row['qrun_over_ideal']:.3f} | "
            f"{_spec(row, 'off_wall_s', '.2f')} | {_spec(row, 'off_over_ideal', '.3f')} | "
            f"{row['naive_over_qrun']:.2f} | {verdicts} |")

    lines += _table_rows(results, 11, summary_line, first_error_line=True)
    lines.append("")
    for name in WORKLOAD_ORDER:
        if name in results:
            lines += _workload_section(name, results[name])
    if "speed" in results:
        lines += _speed_section(results["speed"], results.get("compile"))
    elif "compile" in results:
        lines += _speed_section(None, results["compile"])
    for key in sorted(k for k in results if k.startswith("vllm-")):
        lines += _vllm_section(key, results[key])
    for key in sorted(k for k in results if k.startswith("llamacpp")):
        lines += _llamacpp_section(results[key])
    if any(k.startswith("ttft-") for k in results):
        lines += _ttft_section({k: v for k, v in results.items() if k.startswith("ttft-")})
    if "json_corpus" in results:
        lines += corpus_section(results["json_corpus"])
    if "maskbench" in results:
        lines += maskbench_section(results["maskbench"])
    lines += _notes(results)
    return "\n".join(lines).rstrip() + "\n"


def _vllm_section(key: str, block: Mapping[str, Any]) -> list[str]:
    m = block.get("machine", {})
    lines = [
        f"## vLLM backend, {m.get('dtype')}", "",
        f"`python -m bench --backend vllm --dtype {m.get('dtype')}` (bench/vllm_suite.py): "
        f"vLLM {m.get('vllm')} (CPU build, in-process engine, loaded in "
        f"{m.get('vllm_load_s')} s), commit {m.get('commit')}, {m.get('date')}, load average "
        f"at start {m.get('load_avg')}. **raw vLLM** replays qrun's final token ids as one "
        "`LLM.generate` per stretch of tokens the model chose (greedy, prefix cache on), a "
        "token written inside a healed prefix counted as generated, so qrun/raw is qrun's own "
        "overhead (target ≤ 1.10); **raw, healed as prompt** feeds those tokens as prompt text "
        "(a tool without token healing: what healing costs, one engine step per healed hole "
        "the model completes with the healed token). **transformers** is qrun on the "
        "transformers backend, same dtype, same process. The machine is shared: passes vary "
        "by 10-30 %.", "",
        "| workload | qrun on vLLM s | raw vLLM s | qrun/raw | target | raw, healed as prompt s "
        "| qrun/that | qrun on transformers s | transformers/vLLM | same text | forward / "
        "context | cached |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|",
    ]

    def line(name: str, row: Mapping[str, Any]) -> str:
        q = row["qrun"]
        unhealed = row.get("raw_healed_as_prompt", {})
        return (
            f"| {name} | {q['wall_s']:.2f} | {row['raw']['wall_s']:.2f} | "
            f"{row['qrun_over_raw']:.3f} | {'PASS' if row['overhead_pass'] else 'MISS'} | "
            f"{unhealed.get('wall_s', float('nan')):.2f} | "
            f"{row.get('qrun_over_raw_healed_as_prompt', '—')} | "
            f"{row.get('transformers', {}).get('wall_s', float('nan')):.2f} | "
            f"{row.get('transformers_over_vllm')} | {row.get('same_text_as_transformers')} | "
            f"{q['forward_tokens']} / {q['context_tokens']} | {q['cached_tokens']} |")

    return lines + _table_rows(block, 12, line) + [""]


def _llamacpp_section(block: Mapping[str, Any]) -> list[str]:
    m = block.get("machine", {})
    lines = [
        f"## llama.cpp backend, {m.get('dtype')}, {m.get('threads')} thread(s)", "",
        "`python -m bench --backend llamacpp` (bench/llamacpp_suite.py; "
        "`QRUN_LLAMACPP_THREADS=N` for another thread count): llama-cpp-python "
        f"{m.get('llamacpp')} on the shipped GGUF ({m.get('dtype')}, loaded in "
        f"{m.get('llamacpp_load_s')} s), {m.get('threads')} threads, commit {m.get('commit')}, "
        f"{m.get('date')}, load average at start {m.get('load_avg')}. **raw llama.cpp** "
        "replays qrun's final token ids through the same ctypes calls on a context of its "
        "own: one sequence per run kept across segments (its prefix shared with the previous run "
        "kept), the text before each stretch of "
        "model-chosen tokens in one decode, then one decode per chosen token (argmax read, "
        "no masks), so qrun/raw is qrun's own overhead (target ≤ 1.10). **transformers** is "
        "qrun on the transformers backend (its default dtype), same process. The machine is "
        "shared: passes vary by 10-30 %.", "",
        "| workload | qrun on llama.cpp s | raw llama.cpp s | qrun/raw | target | qrun on "
        "transformers s | transformers/llama.cpp | generated tok/s llama.cpp | same text | "
        "forward / context | cached |",
        "|---|---:|---:|---:|---|---:|---:|---:|---|---:|---:|",
    ]

    def line(name: str, row: Mapping[str, Any]) -> str:
        q = row["qrun"]
        return (
            f"| {name} | {q['wall_s']:.2f} | {row['raw']['wall_s']:.2f} | "
            f"{row['qrun_over_raw']:.3f} | {'PASS' if row['overhead_pass'] else 'MISS'} | "
            f"{row.get('transformers', {}).get('wall_s', float('nan')):.2f} | "
            f"{row.get('transformers_over_llamacpp')} | {q.get('generated_per_s')} | "
            f"{row.get('same_text_as_transformers')} | "
            f"{q['forward_tokens']} / {q['context_tokens']} | {q['cached_tokens']} |")

    lines += _table_rows(block, 11, line) + [""]
    guided = [(n, block[n]) for n in WORKLOAD_ORDER
              if isinstance(block.get(n), Mapping) and "guidance" in block[n]]
    if not guided:
        return lines
    version = next((r["guidance"].get("version") for _, r in guided), "?")
    lines += [
        f"**guidance {version} on llama.cpp**, same run (QRUN_BENCH_GUIDANCE_PYTHON, "
        "scripts/guidance-venv.sh; bench/guidance_runner.py): each run one guidance program "
        "built as one grammar, greedy, same GGUF file, same llama-cpp-python build and "
        "threads, a freshly loaded model per pass (cold KV cache, load not timed), fastest of "
        "the same number of passes, its passes in turn with qrun's on llama.cpp (the order "
        "rotating each round; qrun on transformers was measured earlier in the run). "
        "\"best\" is qrun on its faster backend for the workload. \"valid\" counts the "
        "last pass's first-run regex values that fully match their regex (qrun's always do: "
        "its masks know max_tokens).", "",
        "| workload | qrun on llama.cpp s | qrun on transformers s | guidance on llama.cpp s "
        "| guidance passes s | qrun/guidance | best/guidance | guidance's regex values valid |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for name, row in guided:
        g = row["guidance"]
        tf = (row.get("transformers") or {}).get("wall_s")
        tf_text = f"{tf:.2f}" if isinstance(tf, int | float) else ""
        if "wall_s" not in g:
            lines.append(f"| {name} | {row['qrun']['wall_s']:.2f} | {tf_text} | error "
                         "| | | | |")
            continue
        passes = " / ".join(f"{w:.2f}" for w in g.get("walls_s", []))
        best = row.get("best_over_guidance")
        lines.append(f"| {name} | {row['qrun']['wall_s']:.2f} | {tf_text} | {g['wall_s']:.2f} "
                     f"| {passes} | {row['qrun_over_guidance']:.3f} | "
                     f"{'' if best is None else f'{best:.3f}'} | "
                     f"{g.get('constrained_values_valid')} |")
    return lines + [""]


def _table_rows(block: Mapping[str, Any], columns: int,
                line: Callable[[str, Mapping[str, Any]], str],
                first_error_line: bool = False) -> list[str]:
    """One table line per workload in `block`, in WORKLOAD_ORDER: `line(name, row)`, or for a
    workload that failed, its error (its first line, else its last: the exception) in the
    second of `columns` columns."""
    lines = []
    for name in WORKLOAD_ORDER:
        row = block.get(name)
        if row is None:
            continue
        if "error" in row:
            error = (row["error"].splitlines()[0][:120] if first_error_line
                     else row["error"].splitlines()[-1][:100])
            lines.append(f"| {name} | error: {error} " + "|" + " |" * (columns - 2))
            continue
        lines.append(line(name, row))
    return lines


def _ttft_section(blocks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = [
        "## Time to first token", "",
        "`python -m bench.ttft --runs 5 --backend B --write` (bench/ttft.py): a fresh `qrun "
        "examples/hello.tmpl` process per run, the model cache warm; seconds from process start "
        "to the fixed text before the first hole, to its first generated character, and to "
        "exit (medians).", "",
        "| backend | runs | fixed text s | first token s | exit s | load average | measured |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for key in sorted(blocks):
        block = blocks[key]
        m = block["median"]
        name = block["backend"] + ("" if block.get("packed_linear", True) or
                                   block["backend"] != "transformers" else
                                   " (QRUN_PACKED_LINEAR=0)")
        lines.append(f"| {name} | {block['runs']} | {m['fixed_text_s']:.2f} | "
                     f"{m['first_token_s']:.2f} | {m['exit_s']:.2f} | {m['load_avg']:.2f} | "
                     f"{block['measured_at']} |")
    return lines + [""]


def _spec(row: Mapping[str, Any], key: str, fmt: str) -> str:
    value = (row.get("speculation") or {}).get(key)
    return "—" if value is None else format(value, fmt)


def _workload_section(name: str, row: Mapping[str, Any]) -> list[str]:
    lines = [f"## {name}", ""]
    if "error" in row:
        return lines + [f"Failed ({row.get('measured_at', '')}):", "", "```",
                        row["error"].rstrip(), "```", ""]
    q, ideal, naive = row["qrun"], row["ideal"], row["naive"]
    wall = q["wall_s"] or 1.0
    lines += [
        f"{row['description']}. {row['runs']} run(s); measured {row['measured_at']}; load "
        f"average {row['load_avg_before']} → {row['load_avg_after']}.",
        "",
        "| target | value | bound | |",
        "|---|---:|---:|---|",
    ]
    for t in row["targets"]:
        value = "—" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(f"| {t['name']} | {value} | {t['target']} | "
                     f"{'PASS' if t['pass'] else 'MISS'} |")
    lines += [
        "",
        "| | wall s | forward calls | forward tokens |",
        "|---|---:|---:|---:|",
        f"| qrun | {q['wall_s']:.3f} | {q['forward_calls']} | {row['forward_tokens']} |",
        f"| ideal | {ideal['wall_s']:.3f} | {ideal['forward_calls']} | "
        f"{ideal['forward_tokens']} |",
    ]
    own = row.get("ideal_own_layers")
    if own:
        lines.append(f"| ideal on qrun's packed layers | {own['wall_s']:.3f} | "
                     f"{ideal['forward_calls']} | {ideal['forward_tokens']} |")
    shared = row.get("ideal_shared_prefix")
    if shared:
        lines.append(f"| ideal, common {shared['prefix_tokens']}-token prefix once | "
                     f"{shared['wall_s']:.3f} | {shared['forward_calls']} | "
                     f"{shared['forward_tokens']} |")
    spec = row.get("speculation")
    if spec:
        lines.append(f"| qrun without speculation | {spec['off_wall_s']:.3f} | "
                     f"{spec['off_forward_calls']} | — |")
    lines += [
        f"| naive | {naive['wall_s']:.3f} | {naive['forward_calls']} | "
        f"{naive['forward_tokens']} |",
        "",
        f"qrun's time: model {q['model_s']:.3f} s ({100 * q['model_s'] / wall:.1f} %), masks "
        f"{q['mask_s']:.3f} s ({100 * q['mask_s'] / wall:.1f} %), the rest "
        f"{q['rest_s']:.3f} s ({100 * q['rest_s'] / wall:.1f} %). Context "
        f"{row['context_tokens']} tokens ({q['prompt_tokens']} fixed, "
        f"{q['generated_tokens']} generated, {q['forced_tokens']} forced, "
        f"{q['healed_tokens']} healed, {q['rollback_tokens']} rolled back, "
        f"{q['boundary_kept']} boundary tokens kept). The ideal made "
        f"{ideal['decisions']} decisions, its unmasked argmax agreeing with qrun's token at "
        f"{ideal['argmax_agree']}; decisions read from the hole records. Tokens re-sampled "
        f"inside a healed prefix: {row.get('healed_tokens_resampled', '—')}; they give back "
        f"the template's own text, so the ideal feeds them as fixed text. Naive values equal "
        f"qrun's for {row['naive_values_agree']} holes; template and naive step list "
        f"{'agree' if row['template_consistent'] else 'DISAGREE'} on the rendered text."
        + (f" Speculation: {spec['drafted_tokens']} tokens drafted, {spec['accepted_tokens']} "
           f"accepted; forward calls {spec['off_forward_calls']} without it, "
           f"{spec['on_forward_calls']} with it; the same text in {spec['same_text']} of "
           f"{row['runs']} run(s)." if spec else ""),
        "",
    ]
    if len(q.get("walls_s", [])) > 1:
        shared_walls = (shared or {}).get("walls_s", [])
        lines += [f"Passes (s): qrun {q['walls_s']}, ideal {ideal['walls_s']}"
                  + (f", ideal with the common prefix once {shared_walls}"
                     if shared_walls else "")
                  + f", naive {naive['walls_s']}.", ""]
    return lines


def _speed_section(speed: Mapping[str, Any] | None, compiled: Mapping[str, Any] | None
                   ) -> list[str]:
    lines = ["## Model speed options", ""]
    if speed is not None and "error" in speed:
        lines += ["Failed:", "", "```", speed["error"].rstrip(), "```", ""]
    elif speed is not None:
        lines += [
            f"SmolLM2-135M on this CPU, measured {speed.get('measured_at', '')} (load average "
            f"{speed.get('load_avg_before')} → {speed.get('load_avg_after')}). Prefill: one "
            "forward over the first N tokens of the longdoc document (`logits_to_keep=1`), "
            f"median; decode: {speed['decode_steps']} greedy one-token forwards after it, "
            "median ms/token.",
            "",
            "| dtype | threads | grad mode | cache | prefill 256 tok/s | decode @256 ms | "
            "prefill 1k tok/s | decode @1k ms |",
            "|---|---:|---|---|---:|---:|---:|---:|",
        ]
        for row in speed["configs"]:
            head = f"| {row['dtype']} | {row['threads']} | {row['grad']} | {row['cache']} |"
            if "error" in row:
                lines.append(f"{head} error: {row['error'][:100]} | | | |")
                continue
            cells = []
            for ctx in ("256", "1024"):
                r = row.get(ctx, {})
                cells += [f"{r.get('prefill_tok_s', '—')}", f"{r.get('decode_ms', '—')}"]
            lines.append(head + " " + " | ".join(cells) + " |")
        lines += ["", _defaults_line(speed), ""]
    if compiled is not None:
        if "skipped" in compiled:
            lines += [f"torch.compile: skipped — {compiled['skipped']} "
                      f"({compiled.get('measured_at', '')}).", ""]
        elif "error" in compiled:
            lines += [f"torch.compile: failed — {compiled['error'].splitlines()[0]}", ""]
        else:
            c = compiled
            lines += [
                f"torch.compile (inductor, `dynamic=False`, StaticCache), measured "
                f"{c.get('measured_at', '')} in a child process: compiling took "
                f"{c['compile_s']} s; decode at {c['context']} context "
                f"{c['compiled_static']['decode_ms']} ms/token compiled vs "
                f"{c['eager_static']['decode_ms']} eager with the same StaticCache and "
                f"{c['eager_dynamic']['decode_ms']} eager with DynamicCache; prefill "
                f"{c['compiled_static']['prefill_tok_s']} vs "
                f"{c['eager_dynamic']['prefill_tok_s']} tok/s.",
                "",
            ]
    return lines


def _defaults_line(speed: Mapping[str, Any]) -> str:
    """What qrun runs with on this CPU, and the measured row that says why."""
    dtype = speed.get("default_dtype")
    if dtype is None:
        return ""
    rows = {(r["dtype"], r["threads"], r["grad"], r["cache"]): r for r in speed["configs"]
            if "error" not in r}
    threads = max((r["threads"] for r in speed["configs"]), default=1)
    chosen = rows.get((dtype, threads, "inference_mode", "dynamic"))
    if chosen is None:
        return ""

    def figures(row: Mapping[str, Any]) -> str:
        return (f"prefill {row['1024']['prefill_tok_s']} tok/s, decode "
                f"{row['1024']['decode_ms']} ms/token at 1k")

    others = [f"{k[0]}, {k[1]} thread(s), {k[2]}, {k[3]} cache: {figures(r)}"
              for k, r in rows.items() if r is not chosen]
    return (f"**qrun's CPU defaults here**: {dtype} (float32 on every CPU, see "
            "`default_dtype`, its linear layers packed unless QRUN_PACKED_LINEAR=0), "
            f"torch's own thread count ({threads}), "
            "`inference_mode`, DynamicCache, no torch.compile: "
            f"{figures(chosen)}; the others: " + "; ".join(others) + ".")


def _notes(results: Mapping[str, Any]) -> list[str]:
    m = results.get("machine", {})
    notes = []
    threads, cores = m.get("torch_threads"), m.get("cores")
    if threads and cores and threads < cores:
        notes.append(
            f"- The workloads ran with `--threads {threads}` ({cores} cores). On this shared VM "
            "all-core torch threads are the slow option whenever another process is busy: each "
            "OpenMP region waits for the thread that lost its core, and vocabulary-wide tensor "
            "ops (49,152 logits, above torch's 32,768-element grain) become multi-thread "
            "regions too" + _threads_evidence(results.get("speed"), cores) + ". One thread "
            "gives stable figures; the ratios compare like with like either way.")
    for name in WORKLOAD_ORDER:
        row = results.get(name, {})
        q = row.get("qrun", {})
        if q.get("rollback_tokens") and "forward_tokens" in row:
            rest = (row["forward_tokens"] - q["rollback_tokens"]) / row["context_tokens"]
            notes.append(
                f"- {name}: {q['rollback_tokens']} of qrun's forward tokens were rolled back "
                f"(select options that lost, scored in full as docs/language.md §8 requires; "
                f"healed tokens fed with the text before a hole that the model then replaced; "
                f"stop-string overshoots); without them forward/context is {rest:.3f}.")
    if "batch" in results and "ideal_shared_prefix" in results["batch"]:
        b = results["batch"]
        notes.append(
            f"- batch: qrun's prefix cache computes the {b['ideal_shared_prefix']['prefix_tokens']}"
            f"-token few-shot prefix once, so the issue's ideal (16 runs from empty caches) is "
            f"beaten; against the ideal that also computes it once, qrun/ideal is "
            f"{b.get('qrun_over_ideal_shared_prefix')}.")
    return ["## Notes", "", *notes, ""] if notes else []


def _threads_evidence(speed: Mapping[str, Any] | None, cores: int) -> str:
    """'(float32 decode 59-65 ms/token with 1 thread, 62-740 with 2, in the speed table)'."""
    if not speed or "configs" not in speed:
        return ""
    spans = {}
    for row in speed["configs"]:
        if (row.get("dtype"), row.get("grad"), row.get("cache")) != (
                "float32", "inference_mode", "dynamic") or "error" in row:
            continue
        values = [row[c]["decode_ms"] for c in ("256", "1024") if c in row]
        if values:
            spans[row["threads"]] = f"{min(values):.0f}-{max(values):.0f}"
    if 1 not in spans or cores not in spans:
        return ""
    return (f" (float32 decode {spans[1]} ms/token with 1 thread, {spans[cores]} with {cores}, "
            "in the speed table)")
