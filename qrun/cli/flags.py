"""The flags every `qrun` command shares, declared once: the model flags (`--model`,
`--backend`, `--url`, `--device`, `--dtype`, and where a command has them `--timeout` and
`--cache-mb`), read back as one checked ModelOptions, and `--functions` (repeatable: the
files' host functions together)."""

from __future__ import annotations

import argparse

from qrun.functions import Functions
from qrun.options import BACKENDS, DTYPES, GGUF_DTYPES, ModelOptions

MODEL_HELP = "smollm2 (default), a .gguf file, a HF folder or a hub id (org/name)"


def add_model_flags(parser: argparse.ArgumentParser, *, model_help: str = MODEL_HELP,
                    backend: str | None = None, cache_mb: str | None = None,
                    timeout: bool = False) -> None:
    """Add the model flags to `parser`: `backend` is --backend's default (None: the
    template's front matter, else transformers), `cache_mb` --cache-mb's help (None: no such
    flag), `timeout` whether --timeout (a vLLM server's) is one."""
    parser.add_argument("--model", help=model_help)
    parser.add_argument("--backend", default=backend, choices=BACKENDS,
                        help="transformers (default); vllm: in this process, or against a "
                             "vLLM server with --url; llamacpp: a .gguf file on llama.cpp")
    parser.add_argument("--url", help="with --backend vllm: an OpenAI-compatible `vllm serve` "
                                      "(http://HOST:PORT); --model names its tokenizer")
    if timeout:
        parser.add_argument("--timeout", type=float, metavar="SECONDS",
                            help="with --url: how long a request waits for the server "
                                 "(default 600, as the openai SDK; 5 s to connect)")
    parser.add_argument("--device", help="cpu (default) or cuda[:N]")
    parser.add_argument("--dtype", choices=(*DTYPES, *GGUF_DTYPES, "auto"),
                        help="the weights' type: float32 (default on the CPU), bfloat16 or "
                             "float16; with --backend llamacpp, auto (the GGUF as shipped) or "
                             "q8_0 (re-quantized once: faster prompts and batches)")
    if cache_mb is not None:
        parser.add_argument("--cache-mb", type=int, metavar="MB", help=cache_mb)


def model_options(args: argparse.Namespace) -> ModelOptions:
    """The model flags given, checked as ModelOptions checks them (the message names the
    flags: `--cache-mb must be ≥ 0`).

    Raises:
        UsageError: a flag's value is out of range, or flags that do not go together.
    """
    given = {name: getattr(args, name, None) for name in ModelOptions.names()
             if name != "weights"}
    return ModelOptions.checked(given, lambda name: "--" + name.replace("_", "-"))


def add_functions_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """Add --functions (repeatable); `what` says who calls them."""
    parser.add_argument("--functions", metavar="FILE.py", action="append", default=[],
                        help=f"host functions {what} may call: the `functions` (a dict or a "
                             "qrun.Functions) that this Python file defines; it is imported, "
                             "so name only your own code; repeatable (a name in two files is "
                             "an error)")


def functions_of(args: argparse.Namespace) -> Functions | None:
    """The host functions of the --functions files given, together; None without any.

    Raises:
        UsageError: a file cannot be loaded, or two of them register the same name.
    """
    if not args.functions:
        return None
    from qrun.cli.functions_file import load_all_functions

    return load_all_functions(args.functions)
