"""The qrun command: outputs, exit codes and error messages (on a saved tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import QA, write

from qrun.cli import main


def test_json_output(tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([write(tmp_path, QA), "-v", "question=Why?", "--model", tiny_folder, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out) == {"text", "vars", "stats"}
    assert out["text"] == f"Question: Why?\nAnswer:{out['vars']['answer']}\nDone."
    assert out["stats"]["forward_tokens"] <= out["stats"]["context_tokens"]
    assert out["stats"]["generated_tokens"] == 6


def test_streams_text_and_prints_stats(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([write(tmp_path, QA), "-v", "question=Why?", "--model", tiny_folder, "--stats"])
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out.startswith("Question: Why?\nAnswer:")
    assert captured.out.endswith("\nDone.\n")
    assert json.loads(captured.err)["context_tokens"] > 0


def test_json_values_and_vars_file(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    template = write(tmp_path, "{% for x in items %}{{ x }};{% endfor %} n={{ n + 1 }}")
    vars_file = tmp_path / "v.json"
    vars_file.write_text('{"n": 41}')
    code = main([template, "-v", 'items:=["a", "b"]', "--vars", str(vars_file),
                 "--model", tiny_folder, "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["text"] == "a;b; n=42"


def test_syntax_error_points_at_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "Hello\n{{ gen answer max_tokens=5 \nbye")
    code = main([path, "--check"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"{path}:2:")
    assert "error:" in err and "^" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("template", "summary"), [
    ("{{ gen a }}", "1 hole, inputs: none"),
    ("{{ q }}{% for i in xs %}{{ gen a }}{% endfor %}{{ select b options=['x'] }}",
     "2 holes, inputs: q, xs"),
    ("hi", "0 holes, inputs: none"),
])
def test_check_counts_holes_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str, summary: str
) -> None:
    path = write(tmp_path, template)
    assert main([path, "--check"]) == 0
    assert capsys.readouterr().out == f"{path}: ok ({summary})\n"


LIST_COMPARED = ('{% for i in range(2) %}{{ gen m max_tokens=1 }}{% if m == "a" %}!{% endif %}'
                 "{% endfor %}")


def test_check_prints_warnings_on_stderr_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, LIST_COMPARED)
    assert main([path, "--check"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{path}: ok (1 hole, inputs: none)\n"
    assert captured.err.startswith(f"{path}:1:54: warning: 'm' is a list here")
    assert '  note: compare the latest value: `m[-1] == "a"`\n' in captured.err


def test_a_run_prints_warnings_on_stderr(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([write(tmp_path, LIST_COMPARED), "--model", tiny_folder, "--json"])
    captured = capsys.readouterr()
    assert code == 0
    assert len(json.loads(captured.out)["vars"]["m"]) == 2
    assert ":1:54: warning: 'm' is a list here" in captured.err


def test_missing_input_is_reported_before_any_model_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The model path does not exist: an input error shows the model was never looked at.
    code = main([write(tmp_path, QA), "--model", str(tmp_path / "no-model")])
    err = capsys.readouterr().err
    assert code == 2
    assert "missing input 'question'" in err
    assert ":1:14:" in err  # the first use of the input


def test_json_null_in_a_template_is_pointed_to_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template = '{% set schema = {"enum": ["a", null]} %}{{ gen x json=schema }}'
    code = main([write(tmp_path, template), "--model", str(tmp_path / "no-model")])
    err = capsys.readouterr().err
    assert code == 2
    assert "missing input 'null'" in err and "did you mean `none`?" in err


def test_missing_model_is_a_clear_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([write(tmp_path, QA), "-v", "question=x", "--model", str(tmp_path / "nope")])
    assert code == 2
    assert "model path not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [(["-v", "noequals"], "NAME=VALUE"), (["-v", "x:=[1,"], "invalid JSON"),
     (["--temperature", "-1"], "--temperature"), (["--vars", "/no/such.json"], "--vars"),
     (["--presence-penalty", "3"], "--presence-penalty: presence_penalty must be a number in"),
     (["--logit-bias", "7"], "expected TOKEN=BIAS"),
     (["--logit-bias", "7=200"], "--logit-bias: logit_bias must be a mapping"),
     (["--particles", "0"], "--particles: particles must be an integer from 1 to 64"),
     (["--sampler", "smc", "--top-k", "4"], "--sampler: sampler 'smc' cannot be used with"),
     (["--sampler", "exact", "--particles", "8"], "particles applies to sampler 'smc' only"),
     (["--sampler", "mask", "--ess-threshold", "0.2"],
      "ess_threshold applies to sampler 'smc' only, not 'mask'")],
)
def test_bad_arguments(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([write(tmp_path, "hi"), *args]) == 2
    assert message in capsys.readouterr().err


def test_unreadable_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent.tmpl")]) == 2
    assert "cannot read template" in capsys.readouterr().err


def test_a_pipe_or_device_as_the_template_is_refused_without_reading_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Reading either used to block (a named pipe nobody writes to) or to fill the memory
    # (/dev/zero never ends).
    pipe = tmp_path / "p.tmpl"
    os.mkfifo(pipe)
    assert main([str(pipe), "--check"]) == 2
    assert capsys.readouterr().err == (f"cannot read template {pipe}: it is a named pipe "
                                       "(FIFO), not a file\n")
    assert main(["/dev/zero", "--check"]) == 2
    assert capsys.readouterr().err == ("cannot read template /dev/zero: it is a character "
                                       "device, not a file\n")


def test_a_template_over_a_size_limit_is_a_template_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "{{ x }}\n" * 20_000)
    assert main([path, "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:10001:1: error: too many tags: 20,000 (at most 10,000)\n")


def test_inputs_lines_keep_going_after_a_bad_line(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"question": "one"}\n{"other": 1}\nnot json\n{"question": "four"}\n')
    code = main([write(tmp_path, QA), "--inputs", str(lines), "--model", tiny_folder])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1
    assert len(rows) == 4
    assert rows[0]["vars"]["answer"] is not None and "error" not in rows[0]
    assert "missing input 'question'" in rows[1]["error"]
    assert "invalid JSON" in rows[2]["error"]
    assert rows[3]["text"].startswith("Question: four")


def test_console_script_runs_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "qrun.cli", write(tmp_path, "{{ x }}"),
                           "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_batched_inputs_print_in_input_order(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "in.jsonl"
    questions = [f"q{i}" for i in range(7)]
    lines.write_text("".join(json.dumps({"question": q}) + "\n" for q in questions)
                     + '{"oops": 1}\n')
    code = main([write(tmp_path, QA), "--inputs", str(lines), "--model", tiny_folder,
                 "--batch-size", "3", "--quiet"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1
    assert [r["text"].split("\n")[0] for r in rows[:7]] == [f"Question: {q}" for q in questions]
    assert "missing input 'question'" in rows[7]["error"]
    code = main([write(tmp_path, QA), "--inputs", str(lines), "--model", tiny_folder])
    sequential = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r.get("text") for r in sequential] == [r.get("text") for r in rows]


def test_bad_batch_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text("{}\n")
    assert main([write(tmp_path, "hi"), "--inputs", str(lines), "--batch-size", "0"]) == 2
    assert "--batch-size must be ≥ 1" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    # Options that apply only with another: refused, not silently ignored.
    (["--batch-size", "4"], "--batch-size runs lines of --inputs together: give --inputs too"),
    (["--timeout", "5"], "--timeout is how long a request waits for a vLLM server: it needs --url"),
    (["--backend", "vllm", "--url", "http://127.0.0.1:9", "--timeout", "0"],
     "--timeout must be > 0 seconds"),
    # issue #38: the first read all of standard input, the run answered no line and exit 0
    (["--inputs", "-", "--vars", "-"], "--inputs - and --vars - both read standard input"),
])
def test_options_that_need_another(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   args: list[str], message: str) -> None:
    assert main([write(tmp_path, "hi"), *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("args", "template", "message"), [
    # Checked by ModelOptions, the message naming the flag, before any model is looked for.
    (["--cache-mb", "-1"], "hi", "--cache-mb must be ≥ 0, got -1"),
    (["--device", "gpu"], "hi", "--device must be cpu, cuda, cuda:N, mps or auto, got 'gpu'"),
    (["--model", ""], "hi", "--model must be a model name or path, got ''"),
    (["--url", "http://127.0.0.1:9"], "hi", "--url needs --backend vllm (a vLLM server)"),
    (["--backend", "llamacpp", "--device", "cuda"], "hi",
     "--device cuda was asked for, but the llamacpp backend runs on the CPU"),
    (["--backend", "llamacpp", "--dtype", "float16"], "hi",
     "--dtype float16 does not apply to the llamacpp backend: it runs the GGUF file's own "
     "quantisation (auto) or a copy re-quantized to q8_0"),
    # The front matter's choice merged with the flags: named as the option it is.
    (["--backend", "llamacpp"], "---\ndevice: cuda\n---\nhi",
     "device cuda was asked for, but the llamacpp backend runs on the CPU"),
])
def test_bad_model_options(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           args: list[str], template: str, message: str) -> None:
    assert main([write(tmp_path, template), *args]) == 2
    err = capsys.readouterr().err
    assert err.strip() == message


def test_logit_bias_and_penalties_as_flags(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Token 1000 is b"()" in the tiny model's vocabulary (tests/runtime/test_penalties.py).
    template = write(tmp_path, "Hi {{ gen x max_tokens=6 }}")
    assert main([template, "--model", tiny_folder, "--logit-bias", "1000=100",
                 "--frequency-penalty", "0.5", "--json"]) == 0
    value = json.loads(capsys.readouterr().out)["vars"]["x"]
    assert value.endswith("()" * 5), value


def test_sampler_and_particles_as_flags(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    template = write(tmp_path, 'Pet: {{ gen x regex=" (cat|dog)" }}')
    assert main([template, "--model", tiny_folder, "--sampler", "exact", "--json",
                 "--fields", "holes"]) == 0
    assert set(json.loads(capsys.readouterr().out)["holes"]["x"]["value_probs"]) == \
        {" cat", " dog"}
    assert main([template, "--model", tiny_folder, "--particles", "5", "--seed", "1",
                 "--json", "--fields", "holes"]) == 0
    assert len(json.loads(capsys.readouterr().out)["holes"]["x"]["particles"]) == 5
    # --ess-threshold alone asks for particles too, and is held to 0 to 1 by its name.
    assert main([template, "--model", tiny_folder, "--ess-threshold", "0.3", "--seed", "1",
                 "--json", "--fields", "holes"]) == 0
    assert len(json.loads(capsys.readouterr().out)["holes"]["x"]["particles"]) == 16
    assert main([template, "--model", tiny_folder, "--ess-threshold", "2"]) == 2
    assert "--ess-threshold: ess_threshold must be a number from 0 to 1, got 2.0" in \
        capsys.readouterr().err


def test_a_particles_blocks_run_is_a_json_field(
    tmp_path: Path, tiny_folder: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each block's particles, weights and evidence, as Result.particle_blocks and the trace
    # have them (docs/language.md §23.5); not among the default fields.
    template = write(tmp_path, 'Pet:{% particles 3 %}{{ gen x regex=" (cat|dog)" }}'
                               "{% endparticles %}")
    assert main([template, "--model", tiny_folder, "--seed", "1", "--json", "--fields",
                 "vars,particle_blocks"]) == 0
    row = json.loads(capsys.readouterr().out)
    (block,) = row["particle_blocks"]
    assert block["span"] == {"line": 1, "column": 5}
    assert [p["values"] for p in block["particles"]][block["chosen"]] == row["vars"]
    assert sum(p["weight"] for p in block["particles"]) == pytest.approx(1)
    assert main([template, "--model", tiny_folder, "--seed", "1", "--json"]) == 0
    assert "particle_blocks" not in json.loads(capsys.readouterr().out)
