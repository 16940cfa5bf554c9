"""The RESULTS.md sections of the constraint-engine benchmarks (bench/llg_corpus.py,
bench/maskbench.py), and MaskBench's targets: pure formatting of their stored summaries, so
that bench/report.py renders them without importing the benchmarks (which import it to write
RESULTS.md)."""

from __future__ import annotations

from typing import Any

# Targets of issue #24 (the MaskBench method on the public suite).
TARGETS = {"passing": (">=", 10_500), "invalid_accepted": ("<=", 0),
           "valid_rejected": ("<=", 20), "refused": ("<=", 600),
           "mask_us_p99": ("<=", 500.0), "first_mask_ms_p99": ("<=", 20.0)}

def targets(summary: dict[str, Any]) -> dict[str, bool]:
    values = {"passing": summary["passing"], "invalid_accepted": summary["invalid_accepted"],
              "valid_rejected": summary["valid_rejected"], "refused": summary["refused"],
              "mask_us_p99": summary["mask_us"]["p99"],
              "first_mask_ms_p99": summary["first_mask_ms"]["p99"]}
    out = {}
    for name, (op, bound) in TARGETS.items():
        value = values[name]
        out[name] = value is not None and (value >= bound if op == ">=" else value <= bound)
    return out


def corpus_section(result: dict[str, Any]) -> list[str]:
    """The RESULTS.md section (bench/report.py render) for a stored summary."""
    s, llg, old = result["summary"], result["summary"]["llguidance"], result["summary"].get("old")
    lines = ["## json= engines over the schema corpus", "",
             f"`{result['command']}` ({result['date']}; {s['schemas']} schemas, the first "
             "in corpus order when a run was cut short, from the pip packages of the dev "
             "extra, corpus/schema_corpus.py; the default model's "
             f"tokenizer; Matcher layout {result['layout']}). Each schema is compiled once, "
             "one at a time; the old "
             "engine (schema -> regex -> DFA, closed objects, 10 s limit) gets the same "
             "schemas and the same token sequences. Wall-clock times on the shared 2-core "
             "VM: p99s include preemption.", "",
             "| | llguidance (qrun.Matcher) | old engine |", "| --- | --- | --- |"]

    def row(label: str, key: str, sub: str | None = None) -> str:
        def get(d: dict[str, Any] | None) -> Any:
            if d is None:
                return "-"
            return d[key][sub] if sub else d[key]
        return f"| {label} | {get(llg)} | {get(old)} |"

    lines += [row("schemas compiled", "compiled"), row("schemas/s (compile to first mask)",
                                                       "schemas_per_s"),
              row("compile ms p50", "compile_ms", "p50"), row("compile ms p99", "compile_ms",
                                                              "p99"),
              row("compile ms max", "compile_ms", "max"),
              row("first mask ms p50", "first_mask_ms", "p50"),
              row("first mask ms p99", "first_mask_ms", "p99"),
              row("mask per token ms p50", "mask_ms", "p50"),
              row("mask per token ms p99", "mask_ms", "p99"),
              row("masks timed", "mask_ms", "n"),
              row("valid instances rejected", "valid_rejected"),
              row("invalid instances accepted", "invalid_accepted"), ""]
    lines += [f"llguidance: {llg['valid']} valid instances (each walked with the tokenizer's "
              f"tokens and a random tokenization) on {llg['with_instances']} schemas, "
              f"{llg['invalid']} invalid mutants, {llg['walks']} random budgeted generations "
              f"({llg['walks_invalid']} invalid, {llg['walks_unfinished']} unfinished). "
              "The old engine's counts are over the schemas both compile."
              + (f" Old engine timeouts (10 s): {old['timeouts']}." if old else ""), "",
              "Compile errors (llguidance, first cause): "
              + "; ".join(f"{k} {v}" for k, v in llg["compile_errors"].items()) + ".", ""]
    return lines


def maskbench_section(result: dict[str, Any]) -> list[str]:
    """The RESULTS.md section (bench/report.py render) for a stored summary."""
    s = result["summary"]
    verdict = targets(s)
    rows = [("passing schemas", s["passing"], "passing"),
            ("refused (compile errors)", s["refused"], "refused"),
            ("errors / timeouts", f"{s['errors']} / {s['timeouts']}", None),
            ("valid instances rejected (schema key order)", s["valid_rejected"],
             "valid_rejected"),
            ("invalid instances accepted (schema key order)", s["invalid_accepted"],
             "invalid_accepted"),
            ("valid rejected / invalid accepted, instances' own key order",
             f"{s['own_order_valid_rejected']} / {s['own_order_invalid_accepted']}", None),
            ("valid accepted only in a searched key order", s.get("searched_order", "-"),
             None),
            ("mask µs p50 / p99 / max", f"{s['mask_us']['p50']} / {s['mask_us']['p99']} / "
             f"{s['mask_us']['max']}", "mask_us_p99"),
            ("first mask ms p50 / p99 / max", f"{s['first_mask_ms']['p50']} / "
             f"{s['first_mask_ms']['p99']} / {s['first_mask_ms']['max']}",
             "first_mask_ms_p99"),
            ("first mask ms in the worker's CPU time p50 / p99",
             f"{s['first_mask_cpu_ms']['p50']} / {s['first_mask_cpu_ms']['p99']}", None),
            ("wall time", f"{s['wall_s']} s, {s['workers']} worker(s)", None)]
    lines = ["## MaskBench (qrun.Matcher on the jsonschemabench suite)", "",
             f"`{result['command']}` ({result['date']}; {s['schemas']:,} schemas, "
             f"{s['tests_valid']:,} valid and {s['tests_invalid']:,} invalid instances, "
             f"{s['tokens']:,} masks; llguidance {result.get('llguidance', '?')}; "
             f"SmolLM2's tokenizer; formats=\"{s.get('formats', 'known')}\"; "
             "bench/maskbench.py says the method). Wall-clock times on "
             "the shared VM: p99s include preemption.", "",
             "| | qrun.Matcher | target |", "| --- | ---: | --- |"]
    for label, value, key in rows:
        target = ""
        if key is not None:
            op, bound = TARGETS[key]
            target = f"{op} {bound:,} {'PASS' if verdict[key] else 'MISS'}"
        shown = f"{value:,}" if isinstance(value, int) else value
        lines.append(f"| {label} | {shown} | {target} |")
    lines += ["", "Refused (first cause): " + "; ".join(
        f"{k} {v}" for k, v in s["refused_reasons"].items()) + ".", ""]
    return lines
