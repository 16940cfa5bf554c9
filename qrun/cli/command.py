"""`qrun FILE.tmpl`: argument parsing, printing results or errors, exit codes; no logic. The
JSON it reads and writes goes through qrun/jsonio.py, the feedback around a run (early
text, the loading notice, ordered JSON Lines, Ctrl-C) through qrun/cli/output.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qrun.cli.flags import add_functions_flag, add_model_flags, functions_of, model_options
from qrun.cli.output import (
    Interrupted,
    LoadingNotice,
    OrderedPrinter,
    SkipEcho,
    end_process,
    in_background,
    leading_text,
    write,
)
from qrun.errors import PositionedError, QrunError, TemplateErrors, UsageError
from qrun.jsonio import (
    DEFAULT_FIELDS,
    FIELDS,
    BadInput,
    Rows,
    check_text,
    dumps_line,
    finite,
    parse_line,
    parse_value,
    split_lines,
)
from qrun.lang.ir_dump import dump_program
from qrun.options import SAMPLERS, SAMPLING_OPTIONS, ModelOptions, RunOptions

if TYPE_CHECKING:
    from qrun.api import Query
    from qrun.backends.base import Backend
    from qrun.runtime.request import RunRequest
    from qrun.runtime.result import Result

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_FIELDS_TEXT = ",".join(DEFAULT_FIELDS)
MAX_INPUT_BYTES = 256 << 20
"""The most bytes `--vars` and `--inputs` read (a file or stdin)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qrun",
        description="Run a qrun template: fixed text plus constrained holes filled by a model.",
        epilog="Exit codes: 0 success, 2 template or usage error, 1 run-time failure, "
               "130 interrupted. `qrun serve PATH...` serves templates over HTTP (qrun serve "
               "--help); `qrun test PATH...` runs their test cases (qrun test --help); "
               "`qrun lsp` is the language server editors start (docs/editor.md).",
    )
    parser.add_argument("file", help="the template (.tmpl), or - to read it from standard input")
    parser.add_argument("-v", "--var", action="append", default=[], metavar="NAME=VALUE",
                        help="an input as a string; NAME:=JSON gives a JSON value (repeatable)")
    parser.add_argument("--vars", metavar="FILE.json|-",
                        help="inputs as a JSON object, from a file or stdin (-)")
    parser.add_argument("--inputs", metavar="FILE.jsonl|-",
                        help="one run per line of JSON objects; prints JSON Lines")
    parser.add_argument("--fill", action="append", default=[], metavar="NAME=VALUE",
                        help="give hole NAME its value (its text; NAME:=JSON for a JSON value, "
                             "a list for a hole in a loop): not generated, checked against "
                             "the hole (repeatable)")
    add_model_flags(parser, backend="transformers", timeout=True,
                    cache_mb="prefix cache budget shared by runs (default 1024; 0 turns it off)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--min-p", type=float)
    parser.add_argument("--presence-penalty", type=float)
    parser.add_argument("--frequency-penalty", type=float)
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--logit-bias", action="append", metavar="TOKEN=BIAS",
                        help="add BIAS (-100 to 100) to token id TOKEN's logit (repeatable)")
    parser.add_argument("--sampler", choices=SAMPLERS,
                        help="how constrained holes that do not choose draw their value: "
                             "under the mask (default), exact (scored whole) or smc "
                             "(particles); docs/language.md §14.8")
    parser.add_argument("--particles", type=int, help="particles per hole with --sampler smc "
                        "(default 16)")
    parser.add_argument("--ess-threshold", type=float, help="with --sampler smc, resample when "
                        "the particles' effective sample size falls below this share of "
                        "their number (0 to 1, default 0.5)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-tokens", type=int, help="default max_tokens for holes")
    parser.add_argument("--no-speculate", dest="speculate", action="store_false",
                        help="do not guess tokens from the context inside holes (the output "
                             "is the same; only the number of forwards changes)")
    parser.add_argument("--json", action="store_true",
                        help='print {"text", "vars", "stats"} as JSON instead of streaming')
    parser.add_argument("--fields", default=DEFAULT_FIELDS_TEXT, metavar="LIST",
                        help=f"with --json or --inputs: which of {', '.join(FIELDS)} each row "
                             f"has (default {DEFAULT_FIELDS_TEXT})")
    parser.add_argument("--id", metavar="FIELD",
                        help='with --json or --inputs: each row starts with "id", the value of '
                             "this input")
    parser.add_argument("--stats", action="store_true", help="print run statistics to stderr")
    parser.add_argument("--trace", metavar="FILE.html|FILE.json",
                        help="write what the run did, token by token: a self-contained HTML "
                             "page or JSON (docs/trace.md)")
    add_functions_flag(parser, "the template")
    parser.add_argument("--check", action="store_true", help="parse and compile only")
    parser.add_argument("--dump", action="store_true",
                        help="print the compiled program (one op per line) and exit")
    parser.add_argument("--batch-size", type=int, metavar="B",
                        help="with --inputs: advance up to B runs together (default 1)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar or loading notice on stderr")
    parser.add_argument("--server", metavar="URL",
                        help="run on a `qrun serve` at URL (the template named by this file's "
                             "name; QRUN_API_KEY is sent as its key); same output and exit "
                             "codes")
    return parser


def build_serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qrun serve",
        description="Serve templates over HTTP (docs/serve.md): one model, the runs of every "
                    "request batched together.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="the .tmpl files to serve, or folders of them; each is served "
                             "under its file name without .tmpl")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    add_model_flags(parser, model_help="as for qrun FILE.tmpl (default smollm2)",
                    cache_mb="prefix cache budget shared by every request (default 1024)")
    parser.add_argument("--max-running", type=int, default=8, metavar="N",
                        help="runs advanced together (default 8)")
    parser.add_argument("--max-queue", type=int, default=64, metavar="N",
                        help="runs waiting for a slot; beyond, 429 (default 64)")
    parser.add_argument("--max-body-kb", type=int, default=1024, metavar="KB",
                        help="the largest request body (default 1024 KiB; beyond, 413)")
    parser.add_argument("--max-input-chars", type=int, default=100_000, metavar="N",
                        help="the longest string an input may hold (default 100000; beyond, "
                             "422 input_too_large)")
    parser.add_argument("--max-input-depth", type=int, default=32, metavar="N",
                        help="how deep an input's lists and objects may nest (default 32; "
                             "beyond, 422 input_too_large)")
    parser.add_argument("--body-timeout", type=int, default=60, metavar="SECONDS",
                        help="how long a request's body may take to arrive (default 60; "
                             "beyond, 408)")
    parser.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long a request's headers may take to arrive (default 10; "
                             "beyond, the connection is closed)")
    parser.add_argument("--max-connections", type=int, default=512, metavar="N",
                        help="open connections at most (default 512; one more is closed as "
                             "it is accepted)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="a name clients may reach the server by (the Host header), "
                             "beside localhost, 127.0.0.1 and ::1 (repeatable; '*': any). "
                             "Default: the --host address too; with --host 0.0.0.0 or ::, "
                             "any name")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="requests must send `Authorization: Bearer KEY` (default: the "
                             "environment variable QRUN_API_KEY)")
    add_functions_flag(parser, "the templates")
    parser.add_argument("--drain-timeout", type=int, default=30, metavar="SECONDS",
                        help="on SIGTERM, how long requests in flight may take to finish "
                             "(default 30)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))
    return parser


def build_lsp_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qrun lsp",
        description="Run the qrun language server on stdin and stdout (the Language Server "
                    "Protocol): an editor starts it for .tmpl files (docs/editor.md).")
    add_functions_flag(parser, "the templates (checked as `qrun FILE --check --functions "
                               "FILE.py` checks them; imported once, when the server starts)")
    return parser


def _run_command(argv: list[str]) -> int:
    return _run(build_parser().parse_args(argv))


def _serve_command(argv: list[str]) -> int:
    return _serve(build_serve_parser().parse_args(argv))


def _test_command(argv: list[str]) -> int:
    from qrun.cli.run_tests import run_tests

    return run_tests(argv)


def _lsp_command(argv: list[str]) -> int:
    return _lsp(build_lsp_parser().parse_args(argv))


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "serve": _serve_command, "test": _test_command, "lsp": _lsp_command}
"""`qrun NAME ARGS...`, by the first word; anything else is `qrun FILE.tmpl ...`."""


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    name = given[0] if given and given[0] in SUBCOMMANDS else None
    command, rest = (SUBCOMMANDS[name], given[1:]) if name is not None else (_run_command, given)
    if name == "lsp":
        return command(rest)  # the protocol owns stdout: nothing is printed around it
    write.open_line = False
    try:
        return command(rest)
    except QrunError as exc:
        write.end_line()
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        write.end_line()
        print("qrun: interrupted", file=sys.stderr)
        if isinstance(exc, Interrupted) and exc.runs_left:
            end_process(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # a bug in qrun, not in the user's input
        if os.environ.get("QRUN_DEBUG"):
            traceback.print_exc()
        print(f"qrun: internal error: {type(exc).__name__}: {exc}\n"
              "(set QRUN_DEBUG=1 for a traceback, and please report it)", file=sys.stderr)
        # qrun test's 1 means "a case failed": a CI job must tell a crash from that (3, as
        # pytest's internal error).
        return EXIT_INTERNAL if name == "test" else EXIT_RUNTIME


def _lsp(args: argparse.Namespace) -> int:
    try:
        from qrun.lsp.server import serve
    except ImportError as err:  # pygls is the `lsp` extra's
        print(f"qrun lsp needs pygls and lsprotocol ({err}): pip install 'qrun[lsp]'",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        functions = functions_of(args)
    except QrunError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    return serve(functions.signatures() if functions is not None else None)


def _run(args: argparse.Namespace) -> int:

    _validate(args)
    fields = _fields(args.fields)
    options = _options(args)
    if args.server:
        return _run_on_server(args, fields, options)
    wanted = model_options(args)
    query = _query(args)
    for warning in query.warnings:  # on stderr; the exit code stays the run's
        print(warning.render(), file=sys.stderr)
    if args.dump:
        print(dump_program(query.program))
        return EXIT_OK
    if args.check:
        holes = len(query.program.captures)
        # An input a run may leave out (a default, `is defined`) is listed too, marked so.
        names = [*query.inputs, *(f"{name} (optional)"
                                  for name in query.program.optional_inputs)]
        print(f"{args.file}: ok ({holes} hole{'' if holes == 1 else 's'}, inputs: "
              f"{', '.join(names) or 'none'})")
        return EXIT_OK
    inputs, typed_strings = _inputs(args)
    _read_as_declared(query, inputs, typed_strings)
    fill = _fills(args)
    if args.inputs:
        if fill:
            raise UsageError("--fill cannot go with --inputs (give each run its values with "
                             "Query.run(fill=...))")
        return _run_lines(query, args, options, wanted, inputs,
                          Rows(fields, args.id, lambda exc: _hint(exc, typed_strings)))
    request = query.request(inputs, options=options, fill=fill)  # before the model loads
    if fill:
        _check_before_loading(query, wanted, request)
    if args.json:
        model = _load(query, wanted, args.quiet)
        rows = Rows(fields, args.id)
        try:
            result = _hinted(lambda: query.runner(model).run(request), typed_strings)
        except QrunError as exc:  # a failed run is a row too, as a failed --inputs line is
            print(dumps_line({**rows.start(inputs), "error": str(exc)}))
            raise
        print(dumps_line(rows.result(result, inputs)))
    else:
        early = leading_text(query.program)
        write(early)  # the template's opening text, before the model loads
        model = _load(query, wanted, args.quiet)
        echo = SkipEcho(early, write)
        result = _hinted(lambda: query.runner(model).run(request.streaming(echo)),
                         typed_strings)
        if not result.text.endswith("\n"):
            write("\n")
    if args.stats:
        print(json.dumps(finite(result.stats.to_dict()), indent=2, allow_nan=False),
              file=sys.stderr)
    if args.trace:
        try:
            result.write_trace(args.trace)
        except OSError as exc:
            raise UsageError(f"--trace {args.trace}: {exc}") from exc
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    """`qrun serve`: load the templates and the model, then serve until interrupted."""
    from qrun.serve import ServeOptions, allowed_hosts, app, run_server

    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1-65535, got {args.port}")
    if not args.drain_timeout >= 0:
        raise UsageError(f"--drain-timeout must be ≥ 0, got {args.drain_timeout}")
    if args.max_body_kb < 1:  # the command line's unit; ServeOptions checks the bytes
        raise UsageError(f"--max-body-kb must be ≥ 1, got {args.max_body_kb}")
    limits = ServeOptions.checked(
        {"max_running": args.max_running, "max_queue": args.max_queue,
         "max_body_bytes": args.max_body_kb * 1024, "max_input_chars": args.max_input_chars,
         "max_input_depth": args.max_input_depth, "body_timeout_s": args.body_timeout},
        lambda name: "--body-timeout" if name == "body_timeout_s"
        else "--" + name.replace("_", "-"))
    if not args.header_timeout > 0:
        raise UsageError(f"--header-timeout must be > 0, got {args.header_timeout}")
    if args.max_connections < 1:
        raise UsageError(f"--max-connections must be ≥ 1, got {args.max_connections}")
    functions = functions_of(args)
    model = model_options(args)
    api_key = args.api_key or os.environ.get("QRUN_API_KEY") or None
    with LoadingNotice(str(model.model or "the model")):
        asgi = app(args.paths, model=model, functions=functions, api_key=api_key,
                   allowed_hosts=allowed_hosts(args.host, args.allow_host),
                   max_running=limits.max_running, max_queue=limits.max_queue,
                   max_body_bytes=limits.max_body_bytes,
                   max_input_chars=limits.max_input_chars,
                   max_input_depth=limits.max_input_depth,
                   body_timeout_s=limits.body_timeout_s)
    run_server(asgi, args.host, args.port, api_key, args.log_level, args.drain_timeout,
               args.header_timeout, args.max_connections)
    return EXIT_OK


def _run_on_server(args: argparse.Namespace, fields: tuple[str, ...],
                   options: RunOptions) -> int:
    """`--server URL`: the run (or the --inputs lines) on a running `qrun serve`."""
    from qrun.cli.remote import run_remote, run_remote_lines

    if args.file == "-":
        raise UsageError("--server runs a template the server serves, named by its file: give "
                         "the file's name, not -")
    local = [flag for flag, given in (
        ("--check", args.check), ("--dump", args.dump), ("--trace", args.trace),
        ("--functions", args.functions), ("--model", args.model), ("--url", args.url),
        ("--device", args.device), ("--dtype", args.dtype), ("--cache-mb", args.cache_mb),
        ("--batch-size", args.batch_size), ("--backend", args.backend != "transformers"),
        ("--fill", args.fill))
        if given]
    if local:
        raise UsageError(f"--server runs on the server's model and templates: "
                         f"{', '.join(local)} cannot go with it")
    given = {name: getattr(options, name) for name in
             (*SAMPLING_OPTIONS, "seed", "max_tokens", "sampler", "particles", "ess_threshold")
             if getattr(options, name) is not None}
    if options.speculate is False:
        given["speculate"] = False
    inputs, _ = _inputs(args)
    if args.inputs:
        lines = _read_bytes(args.inputs, "--inputs")
        if inputs:
            raise UsageError("--server with --inputs: put every input in the lines")
        return run_remote_lines(args.server, args.file, lines, given, fields, args.id)
    return run_remote(args.server, args.file, inputs, given, fields, args.id, args.json,
                      args.stats)


def _load(query: Query, given: ModelOptions, quiet: bool) -> Backend:
    chosen = query.model_options(given)  # the front matter's choice merged in, for the notice
    with LoadingNotice(str(chosen.model), quiet=quiet):
        return query.load(options=chosen)


def _check_before_loading(query: Query, given: ModelOptions, request: RunRequest) -> None:
    """Known values that do not fit their holes are refused before the weights load: checked
    on the model's tokenizer alone (max_tokens counts its tokens), which the load then reads
    again (about half a second here, against a load of 5 s or more)."""
    chosen = query.model_options(given)
    if chosen.weights is not False:
        tokenizer = query.load(options=dataclasses.replace(chosen, weights=False))
        query.runner(tokenizer).check(request)


def _run_lines(query: Query, args: argparse.Namespace, options: RunOptions,
               model_options: ModelOptions, base: dict[str, Any], rows: Rows) -> int:
    """One run per JSON line; JSON Lines out, in input order, each printed as soon as it and
    every line before it are done. A line that cannot be a run's inputs prints
    {"error": ..., "line": N} with its number in the file, and the rest still run."""
    lines = list(split_lines(_read_bytes(args.inputs, "--inputs")))
    parsed: list[dict[str, Any] | str] = []
    for _, line in lines:
        try:
            parsed.append({**base, **parse_line(line)})
        except BadInput as exc:
            parsed.append(str(exc))
    numbers = [number for number, _ in lines]
    runnable = [i for i, row in enumerate(parsed) if isinstance(row, dict)]
    model = _load(query, model_options, args.quiet) if runnable else None
    printer = OrderedPrinter(len(parsed), quiet=args.quiet)

    def job() -> None:
        for i, row in enumerate(parsed):
            if isinstance(row, str):
                printer.put(i, rows.error(f"{args.inputs}:{numbers[i]}: {row}", numbers[i]))
        if model is None:
            return
        query.run_many(
            [row for row in parsed if isinstance(row, dict)], model=model, options=options,
            batch_size=args.batch_size or 1,
            on_result=lambda k, outcome: printer.put(
                runnable[k], rows.outcome(outcome, parsed[runnable[k]], numbers[runnable[k]])),
        )

    in_background(job, printer)
    return EXIT_RUNTIME if printer.failed else EXIT_OK


def _hinted(run: Any, typed_strings: dict[str, str]) -> Result:
    try:
        result: Result = run()
    except QrunError as exc:
        raise _hint(exc, typed_strings) from None
    return result


def _hint(exc: QrunError, typed_strings: dict[str, str]) -> QrunError:
    """An error at a place in the template about an input given as `-v NAME=3` (a string
    that reads as another JSON value) gains a note: use `NAME:=3`."""
    if not isinstance(exc, PositionedError) or isinstance(exc, TemplateErrors):
        return exc
    spanned = exc.source.text[exc.span.start:exc.span.end]
    notes = [f"-v {name}={value} gives the string {value!r}: use {name}:={value} to pass "
             f"{_json_kind(value)}"
             for name, value in typed_strings.items()
             if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", spanned)]
    if not notes:
        return exc
    return type(exc)(exc.message, exc.span, exc.source, notes=[*exc.notes, *notes])


def _json_kind(text: str) -> str:
    value = json.loads(text)
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else "null"


def _read_bytes(path: str, flag: str) -> bytes:
    """The bytes of an inputs file (or stdin), at most MAX_INPUT_BYTES: `--vars /dev/zero`
    read until memory ran out."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with Path(path).open("rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot read {path}: {exc}") from exc
    if len(data) > MAX_INPUT_BYTES:
        raise UsageError(f"{flag}: {path} holds more than {MAX_INPUT_BYTES:,} bytes, the most "
                         "qrun reads as inputs")
    return data


def _bias(text: str) -> tuple[int, float]:
    """A --logit-bias value, TOKEN=BIAS (its range is RunOptions' check)."""
    token, equals, bias = text.partition("=")
    try:
        if equals and token.strip().isdigit():
            return int(token), float(bias)
    except ValueError:
        pass
    raise UsageError(f"--logit-bias: expected TOKEN=BIAS (a token id and a number), "
                     f"got {text!r}")


def _options(args: argparse.Namespace) -> RunOptions:
    """The run options given as flags, checked as RunOptions checks them (the message names
    the flag)."""
    given = {name: getattr(args, name)
             for name in (*SAMPLING_OPTIONS, "seed", "max_tokens", "speculate", "sampler",
                          "particles", "ess_threshold")}
    if args.logit_bias is not None:
        given["logit_bias"] = dict(_bias(text) for text in args.logit_bias)
    if args.trace:
        given["trace"] = True
    try:
        return RunOptions(**given)
    except UsageError as exc:
        name = next((n for n in given if str(exc).startswith(n + " ")), "")
        raise UsageError(f"--{name.replace('_', '-')}: {exc}" if name else str(exc)) from None


def _query(args: argparse.Namespace) -> Query:
    """The template of `qrun FILE`: the file, or with `-` standard input (compiled as
    `<stdin>`, its includes from the working folder)."""
    from qrun.api import Query
    from qrun.lang.size import MAX_TEMPLATE_SIZE
    from qrun.lang.text import decode_template

    if args.file != "-":
        return Query.from_file(args.file, functions=functions_of(args))
    if "-" in (args.inputs, args.vars):
        raise UsageError("the template comes from standard input (qrun -): give --inputs and "
                         "--vars as files")
    data = sys.stdin.buffer.read(MAX_TEMPLATE_SIZE + 1)
    if len(data) > MAX_TEMPLATE_SIZE:
        raise UsageError(f"the template on standard input is larger than {MAX_TEMPLATE_SIZE} "
                         "bytes")
    return Query(decode_template(data, "<stdin>"), name="<stdin>", include_dir=os.getcwd(),
                 functions=functions_of(args))


def _validate(args: argparse.Namespace) -> None:
    """Checks of the options that are neither run options nor model options (those are
    RunOptions' and ModelOptions' own)."""
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be ≥ 1, got {args.batch_size}")
    if args.batch_size is not None and not args.inputs:
        raise UsageError("--batch-size runs lines of --inputs together: give --inputs too")
    if args.trace and args.inputs:
        raise UsageError("--trace writes one run's trace: use it without --inputs")
    if args.inputs == "-" and args.vars == "-":  # the first would leave the other nothing
        raise UsageError("--inputs - and --vars - both read standard input: give one of them "
                         "a file")
    if args.trace and not args.trace.lower().endswith((".html", ".htm", ".json")):
        raise UsageError(f"--trace {args.trace}: the file must end in .html or .json")
    rows = args.json or args.inputs
    if not rows and (args.id is not None or args.fields != DEFAULT_FIELDS_TEXT):
        raise UsageError("--id and --fields shape JSON rows: give --json or --inputs too")


def _fields(text: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in chosen if name not in FIELDS]
    if unknown or not chosen:
        raise UsageError(f"--fields: choose among {', '.join(FIELDS)} (comma-separated), got "
                         f"{text!r}")
    return tuple(dict.fromkeys(chosen))


def _inputs(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The inputs of -v and --vars, read strictly (qrun/jsonio.py); and the -v NAME=VALUE
    strings that read as other JSON values (for the `:=` hint)."""
    inputs: dict[str, Any] = {}
    if args.vars:
        data = _read_bytes(args.vars, "--vars")
        try:
            loaded = parse_value(data.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise UsageError(f"--vars {args.vars}: invalid UTF-8 at byte {exc.start + 1}") \
                from None
        except BadInput as exc:
            raise UsageError(f"--vars {args.vars}: {exc}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"--vars {args.vars}: expected a JSON object")
        inputs.update(loaded)
    typed: dict[str, str] = {}
    for item in args.var:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"-v expects NAME=VALUE or NAME:=JSON, got {item!r}")
        try:
            check_text(item, f"-v {_shown(name)}")
            if name.endswith(":"):
                inputs[name[:-1]] = parse_value(value)
                continue
        except BadInput as exc:
            raise UsageError(f"-v {_shown(item)}: {exc}" if name.endswith(":") else str(exc)) \
                from None
        inputs[name] = value
        if _reads_as_json(value):
            typed[name] = value
    return inputs, typed


def _read_as_declared(query: Query, inputs: dict[str, Any], typed_strings: dict[str, str]
                      ) -> None:
    """`-v count=3` for an input declared as a number (docs/language.md §4.1): the string
    reads as the JSON value its type wants."""
    from qrun.lang.declared import first_problem

    for name, text in list(typed_strings.items()):
        schema = query.program.input_types.get(name)
        if schema is None or first_problem(schema, inputs[name]) is None:
            continue
        value = parse_value(text)
        if first_problem(schema, value) is None:
            inputs[name] = value
            del typed_strings[name]


def _fills(args: argparse.Namespace) -> dict[str, Any]:
    """The known values of --fill NAME=TEXT and --fill NAME:=JSON."""
    fill: dict[str, Any] = {}
    for item in args.fill:
        name, sep, value = item.partition("=")
        if not sep or not name.rstrip(":"):
            raise UsageError(f"--fill expects NAME=VALUE or NAME:=JSON, got {_shown(item)!r}")
        try:
            check_text(item, f"--fill {_shown(name)}")
            fill[name.rstrip(":")] = parse_value(value) if name.endswith(":") else value
        except BadInput as exc:
            raise UsageError(f"--fill {_shown(item)}: {exc}") from None
    return fill


def _shown(text: str, limit: int = 60) -> str:
    """`text` fit for an error message: printable in UTF-8 (a lone surrogate as its escape)
    and cut to `limit` characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


def _reads_as_json(value: str) -> bool:
    try:
        return not isinstance(parse_value(value), str)
    except BadInput:
        return False

