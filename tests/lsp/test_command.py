"""`qrun lsp` on the command line: without the lsp extra it says what to install (exit 2)."""

from __future__ import annotations

import sys

import pytest

from qrun.cli import main


def test_without_pygls_qrun_lsp_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    monkeypatch.setitem(sys.modules, "qrun.lsp.server", None)  # import fails as without pygls
    assert main(["lsp"]) == 2
    assert "pip install 'qrun[lsp]'" in capsys.readouterr().err


def test_qrun_lsp_takes_no_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["lsp", "--port", "1"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --port 1" in capsys.readouterr().err
