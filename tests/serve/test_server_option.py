"""`qrun FILE.tmpl --server URL` (qrun/cli/remote.py) against a real uvicorn on a free port:
the output and exit codes of a local run."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.cli import main
from qrun.serve import app
from tests.serve.serving import serving

PERSON = ('Name: {{ name }}.\nAge: {{ gen age regex="[0-9]{1,2}" }}'
          '\nCity: {{ gen city regex="[A-Z][a-z]{2,7}" }}\n')


@pytest.fixture(scope="module")
def url(tiny: TransformersBackend) -> Iterator[str]:
    with serving(app({"person": qrun.Query(PERSON)}, model=tiny)) as address:
        yield address


@pytest.fixture
def template(tmp_path: Path) -> str:
    path = tmp_path / "person.tmpl"
    path.write_text(PERSON)
    return str(path)


def test_json_and_streamed_output_are_a_local_runs(
        url: str, template: str, tiny: TransformersBackend,
        capsys: pytest.CaptureFixture[str]) -> None:
    local = qrun.Query(PERSON).run({"name": "Ada"}, model=tiny, seed=3)
    assert main([template, "--server", url, "-v", "name=Ada", "--seed", "3", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert set(row) == {"text", "vars", "stats"}
    assert (row["text"], row["vars"]) == (local.text, local.vars)
    assert main([template, "--server", url, "-v", "name=Ada", "--seed", "3", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert out == local.text
    assert json.loads(err)["generated_tokens"] == local.stats.generated_tokens


def test_errors_exit_as_a_local_run_does(url: str, template: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([template, "--server", url]) == 2
    assert "missing input 'name'" in capsys.readouterr().err
    other = tmp_path / "nobody.tmpl"
    assert main([str(other), "--server", url, "--json"]) == 2
    assert "no template named 'nobody'" in capsys.readouterr().err
    assert main([template, "--server", url, "--model", "x"]) == 2
    assert "--model cannot go with it" in capsys.readouterr().err
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    assert main([template, "--server", closed, "-v", "name=x"]) == 2
    assert "cannot reach the server" in capsys.readouterr().err


def test_inputs_lines_run_on_the_server_in_order(
        url: str, template: str, tmp_path: Path, tiny: TransformersBackend,
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = tmp_path / "people.jsonl"
    lines.write_text('{"id": "a", "name": "Ada"}\nnot json\n{"id": "c", "name": "Cy"}\n')
    code = main([template, "--server", url, "--inputs", str(lines), "--id", "id",
                 "--fields", "vars", "--seed", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1  # a line failed, as with a local --inputs
    assert [row["id"] for row in rows] == ["a", None, "c"]
    assert rows[1]["line"] == 2
    local = qrun.Query(PERSON).run_many([{"name": "Ada"}, {"name": "Cy"}], model=tiny, seed=2)
    assert [rows[0]["vars"], rows[2]["vars"]] == [
        r.vars for r in local if isinstance(r, qrun.Result)]
