"""Feedback on a run (issue #15 item 4, #12 item 6): the opening text before the model loads,
the loading notice, model names that fail at once, the `:=` hint, templates without holes run
on a tokenizer alone, and Ctrl-C during batched runs."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import QA, rows, write

from qrun.backends import loading
from qrun.cli import main
from qrun.cli import output as cli_output
from qrun.cli.output import LoadingNotice, SkipEcho
from qrun.errors import ModelLoadError


def test_opening_text_is_printed_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template = write(tmp_path, "Dear {{ name }},\n{{ gen body }}")
    # The model folder is missing: the opening text was printed before loading failed.
    code = main([template, "-v", "name=Ann", "--model", str(tmp_path / "missing")])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == "Dear \n"  # the open line is ended before the error
    assert "model path not found" in captured.err


@pytest.mark.parametrize(
    ("template", "early"),
    [("Hello there.\n{{ gen a max_tokens=3 }} and {{ x }}", "Hello there.\n"),
     ("{% user %}Hi{% enduser %}{{ gen a max_tokens=3 }}", ""),  # a role block first
     ("{{ x }} then {{ gen a max_tokens=3 }}", "")],
)
def test_opening_text_is_printed_once(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str], template: str,
    early: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_stdout_at_load: list[str] = []
    enter = LoadingNotice.__enter__

    def noting(self: LoadingNotice) -> LoadingNotice:
        on_stdout_at_load.append(sys.stdout.getvalue())  # type: ignore[union-attr]
        return enter(self)

    monkeypatch.setattr(LoadingNotice, "__enter__", noting)
    assert main([write(tmp_path, template), "-v", "x=X", "--model", tiny_folder]) == 0
    out = capsys.readouterr().out
    assert on_stdout_at_load == [early]
    assert main([write(tmp_path, template), "-v", "x=X", "--model", tiny_folder, "--json"]) == 0
    assert out == json.loads(capsys.readouterr().out)["text"] + "\n"


def test_skip_echo_drops_the_shown_text_once() -> None:
    out: list[str] = []
    echo = SkipEcho("Hello world", out.append)
    for piece in ["Hello ", "world", "!", "Hello"]:
        echo(piece)
    assert "".join(out) == "!Hello"


class TerminalStderr(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_loading_notice_shows_on_a_terminal_and_is_erased(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_output, "NOTICE_AFTER_S", 0.05)
    terminal = TerminalStderr()
    monkeypatch.setattr(sys, "stderr", terminal)
    with LoadingNotice("smollm2"):
        time.sleep(0.4)
    assert terminal.getvalue() == "\0337qrun: loading model smollm2 ...\0338\033[J"
    for quiet, stream in [(True, TerminalStderr()), (False, io.StringIO())]:
        monkeypatch.setattr(sys, "stderr", stream)
        with LoadingNotice("smollm2", quiet=quiet):
            time.sleep(0.2)
        assert stream.getvalue() == ""  # --quiet, or not a terminal


def test_fast_loading_shows_no_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = TerminalStderr()
    monkeypatch.setattr(sys, "stderr", terminal)
    with LoadingNotice("smollm2"):
        pass
    time.sleep(cli_output.NOTICE_AFTER_S + 0.1)
    assert terminal.getvalue() == ""


def test_a_typo_in_the_model_name_fails_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.perf_counter()
    code = main([write(tmp_path, QA), "-v", "question=x", "--model", "smolm2"])
    err = capsys.readouterr().err
    assert code == 2
    assert time.perf_counter() - started < 5
    assert "unknown model 'smolm2'; did you mean 'smollm2'?" in err
    assert "local models: smollm2 (the default)" in err


def test_a_hub_id_offline_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    assert main([write(tmp_path, QA), "-v", "question=x", "--model", "org/model"]) == 2
    assert "HF_HUB_OFFLINE is set" in capsys.readouterr().err


def test_an_unreachable_hub_times_out_quickly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from huggingface_hub import constants

    silent = socket.socket()  # accepts connections, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(loading, "HUB_TIMEOUT_S", 0.5)
    started = time.perf_counter()
    try:
        with pytest.raises(ModelLoadError, match="did not answer within 0.5 s"):
            loading.locate_model("org/model")
    finally:
        silent.close()
    assert time.perf_counter() - started < 3


@pytest.mark.parametrize(("template", "message"),
                         [("{% for i in range(count) %}x{% endfor %}", "range()"),
                          ("A: {{ gen a max_tokens=count }}", "max_tokens must be")])
def test_a_number_given_as_a_string_gets_a_hint(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str], template: str,
    message: str
) -> None:
    code = main([write(tmp_path, template), "-v", "count=3", "-v", "other=4", "--model",
                 tiny_folder])
    err = capsys.readouterr().err
    assert code == 1
    assert message in err
    assert "note: -v count=3 gives the string '3': use count:=3 to pass a number" in err
    assert "other" not in err  # only inputs the failing expression uses


def test_the_hint_reaches_inputs_lines(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"x": 1}\n')
    template = write(tmp_path, "{{ gen a max_tokens=n }}")
    assert main([template, "--inputs", str(lines), "-v", "n=2", "--model", tiny_folder]) == 1
    assert "use n:=2 to pass a number" in rows(capsys.readouterr().out)[0]["error"]


def test_a_template_without_holes_loads_no_weights(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import qrun.backends.transformers as adapter

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(adapter, "load_transformers", refuse)
    template = write(tmp_path, "{% user %}Hi {{ name }}{% enduser %}{% for i in range(2) %}"
                               "{{ i }}{% endfor %}")
    code = main([template, "-v", "name=Ann", "--model", tiny_folder, "--json"])
    row = json.loads(capsys.readouterr().out)
    assert code == 0
    assert row["text"] == "<|im_start|>user\nHi Ann<|im_end|>\n01"
    assert row["stats"]["context_tokens"] > 0 and row["stats"]["forward_calls"] == 0


SLOW = "Question: {{ question }}\nAnswer:{{ gen answer max_tokens=60 }}"


@pytest.mark.parametrize("batch_size", [pytest.param("4", marks=pytest.mark.slow), "1"])
def test_ctrl_c_during_inputs_keeps_printed_lines_whole(
    tmp_path: Path, tiny_folder: str, batch_size: str
) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"question": f"q{i}"}) + "\n" for i in range(3000)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "qrun.cli", write(tmp_path, SLOW), "--inputs", str(lines),
         "--model", tiny_folder, "--batch-size", batch_size, "--fields", "vars"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # A shell's background job (`make test &`) runs with SIGINT ignored, and children
        # inherit that; qrun, like any program, then keeps ignoring Ctrl-C. The test is
        # about qrun's own handling, so its qrun starts with the default disposition.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()  # runs are under way
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # a failed test leaves no run going through 3,000 lines
            proc.kill()
            proc.communicate()
    printed = rows((first + out).decode("utf-8"))
    assert proc.returncode == 130, err.decode()
    assert err.decode().strip() == "qrun: interrupted"  # no traceback, nothing else
    assert 1 <= len(printed) < 3000
    assert all("answer" in row["vars"] for row in printed)
