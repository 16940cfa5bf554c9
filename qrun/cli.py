"""`qrun FILE.tmpl`: argument parsing, printing results or errors, exit codes; no logic."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qrun.errors import QrunError, UsageError
from qrun.options import RunOptions

if TYPE_CHECKING:
    from qrun.api import Query
    from qrun.backends.base import Backend

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qrun",
        description="Run a qrun template: fixed text plus constrained holes filled by a model.",
        epilog="Exit codes: 0 success, 2 template or usage error, 1 run-time failure.",
    )
    parser.add_argument("file", help="the template (.tmpl)")
    parser.add_argument("-v", "--var", action="append", default=[], metavar="NAME=VALUE",
                        help="an input as a string; NAME:=JSON gives a JSON value (repeatable)")
    parser.add_argument("--vars", metavar="FILE.json|-",
                        help="inputs as a JSON object, from a file or stdin (-)")
    parser.add_argument("--inputs", metavar="FILE.jsonl",
                        help="one run per line of JSON objects; prints JSON Lines")
    parser.add_argument("--model", help="smollm2 (default), a .gguf file, a HF folder or hub id")
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm"],
                        help="transformers (default), or vllm: in this process, or against a "
                             "vLLM server with --url")
    parser.add_argument("--url", help="with --backend vllm: an OpenAI-compatible `vllm serve` "
                                      "(http://HOST:PORT); --model names its tokenizer")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="with --url: how long a request waits for the server (default 30)")
    parser.add_argument("--device", help="cpu (default) or cuda[:N]")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-tokens", type=int, help="default max_tokens for holes")
    parser.add_argument("--no-speculate", dest="speculate", action="store_false",
                        help="do not guess tokens from the context inside holes (the output "
                             "is the same; only the number of forwards changes)")
    parser.add_argument("--json", action="store_true",
                        help='print {"text", "vars", "stats"} as JSON instead of streaming')
    parser.add_argument("--stats", action="store_true", help="print run statistics to stderr")
    parser.add_argument("--trace", metavar="FILE.html|FILE.json",
                        help="write what the run did, token by token: a self-contained HTML "
                             "page or JSON (docs/trace.md)")
    parser.add_argument("--check", action="store_true", help="parse and compile only")
    parser.add_argument("--batch-size", type=int, default=1, metavar="B",
                        help="with --inputs: advance up to B runs together (default 1)")
    parser.add_argument("--cache-mb", type=int, metavar="MB",
                        help="prefix cache budget shared by runs (default 1024; 0 turns it off)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except QrunError as exc:
        _flush_stdout_line()
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("qrun: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # a bug in qrun, not in the user's input
        if os.environ.get("QRUN_DEBUG"):
            traceback.print_exc()
        print(f"qrun: internal error: {type(exc).__name__}: {exc}\n"
              "(set QRUN_DEBUG=1 for a traceback, and please report it)", file=sys.stderr)
        return EXIT_RUNTIME


_stdout_open_line = False


def _flush_stdout_line() -> None:
    # After streamed text, start the error message on a fresh line of the terminal.
    if _stdout_open_line:
        sys.stdout.write("\n")
        sys.stdout.flush()


def _run(args: argparse.Namespace) -> int:
    from qrun.api import Query

    _validate(args)
    options = _options(args)
    query = Query.from_file(args.file)
    if args.check:
        print(f"{args.file}: ok ({len(query.program.captures)} holes, inputs: "
              f"{', '.join(query.inputs) or 'none'})")
        return EXIT_OK
    if args.inputs:
        return _run_lines(query, args, options)
    inputs = _inputs(args)
    query.program.check_inputs(inputs)  # before the model is loaded
    model = _load(query, args)
    if args.json:
        result = query.run(inputs, model=model, options=options)
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        result = query.run(inputs, model=model, options=options, on_text=_write)
        if not result.text.endswith("\n"):
            _write("\n")
    if args.stats:
        print(json.dumps(result.stats.to_dict(), indent=2), file=sys.stderr)
    if args.trace:
        try:
            result.write_trace(args.trace)
        except OSError as exc:
            raise UsageError(f"--trace {args.trace}: {exc}") from exc
    return EXIT_OK


def _load(query: Query, args: argparse.Namespace) -> Backend:
    return query.load(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                      cache_mb=args.cache_mb, url=args.url, timeout=args.timeout)


def _run_lines(query: Query, args: argparse.Namespace, options: RunOptions) -> int:
    """One run per JSON line; JSON Lines out, in input order, each printed as soon as it and
    every line before it are done. A bad line prints {"error": ...} and the rest still run."""
    base = _inputs(args)
    lines = _read_lines(args.inputs)
    rows: list[dict[str, Any] | str] = []
    for number, line in enumerate(lines, start=1):
        try:
            values = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append(f"{args.inputs}:{number}: invalid JSON: {exc}")
            continue
        if not isinstance(values, dict):
            rows.append(f"{args.inputs}:{number}: each line must be a JSON object")
            continue
        rows.append({**base, **values})
    runnable = [i for i, row in enumerate(rows) if isinstance(row, dict)]
    printer = _OrderedPrinter(len(rows), _progress(len(rows), args.quiet))
    for i, row in enumerate(rows):
        if isinstance(row, str):
            printer.put(i, {"error": row, "line": i + 1})
    if runnable:
        query.run_many(
            [row for row in rows if isinstance(row, dict)], model=_load(query, args),
            options=options,
            batch_size=args.batch_size,
            on_result=lambda k, outcome: printer.put(runnable[k], _line(outcome, runnable[k])),
        )
    printer.close()
    return EXIT_RUNTIME if printer.failed else EXIT_OK


def _line(outcome: Any, index: int) -> dict[str, Any]:
    if isinstance(outcome, QrunError):
        return {"error": str(outcome), "line": index + 1}
    result: dict[str, Any] = outcome.to_dict()
    return result


class _OrderedPrinter:
    """Prints JSON lines in input order as results arrive in any order (thread-safe)."""

    def __init__(self, total: int, progress: Any) -> None:
        self.lines: dict[int, dict[str, Any]] = {}
        self.next = 0
        self.total = total
        self.failed = False
        self.progress = progress
        self.lock = threading.Lock()

    def put(self, index: int, line: dict[str, Any]) -> None:
        with self.lock:
            self.lines[index] = line
            self.failed |= "error" in line
            if self.progress is not None:
                self.progress.update(1)
            while self.next in self.lines:
                print(json.dumps(self.lines.pop(self.next), ensure_ascii=False), flush=True)
                self.next += 1

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()


def _progress(total: int, quiet: bool) -> Any:
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="run", file=sys.stderr)


def _read_lines(path: str) -> list[str]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    return [line for line in text.splitlines() if line.strip()]


def _options(args: argparse.Namespace) -> RunOptions:
    """The run options given as flags, checked as RunOptions checks them (the message names
    the flag)."""
    given = {name: getattr(args, name)
             for name in ("temperature", "top_p", "top_k", "seed", "max_tokens", "speculate")}
    if args.trace:
        given["trace"] = True
    try:
        return RunOptions(**given)
    except UsageError as exc:
        name = next((n for n in given if str(exc).startswith(n + " ")), "")
        raise UsageError(f"--{name.replace('_', '-')}: {exc}" if name else str(exc)) from None


def _validate(args: argparse.Namespace) -> None:
    """Checks of the options that are not run options (those are RunOptions' own)."""
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be ≥ 1, got {args.batch_size}")
    if args.cache_mb is not None and args.cache_mb < 0:
        raise UsageError(f"--cache-mb must be ≥ 0, got {args.cache_mb}")
    if args.url is not None and args.backend != "vllm":
        raise UsageError("--url needs --backend vllm (a vLLM server)")
    if args.trace and args.inputs:
        raise UsageError("--trace writes one run's trace: use it without --inputs")
    if args.trace and not args.trace.lower().endswith((".html", ".htm", ".json")):
        raise UsageError(f"--trace {args.trace}: the file must end in .html or .json")


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    if args.vars:
        try:
            text = sys.stdin.read() if args.vars == "-" else Path(args.vars).read_text("utf-8")
            loaded = json.loads(text)
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"--vars {args.vars}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise UsageError(f"--vars {args.vars}: expected a JSON object")
        inputs.update(loaded)
    for item in args.var:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"-v expects NAME=VALUE or NAME:=JSON, got {item!r}")
        if name.endswith(":"):
            try:
                inputs[name[:-1]] = json.loads(value)
            except json.JSONDecodeError as exc:
                raise UsageError(f"-v {item}: invalid JSON: {exc}") from exc
        else:
            inputs[name] = value
    return inputs


def _write(text: str) -> None:
    global _stdout_open_line
    sys.stdout.write(text)
    sys.stdout.flush()
    _stdout_open_line = not text.endswith("\n")


if __name__ == "__main__":
    sys.exit(main())
