"""A `vllm serve` of the default model on 127.0.0.1 for the vllm tier's tests (tests/test_vllm.py,
tests/serve/test_serve_vllm.py): started with the options the local engines are compared
under, waited for, and stopped at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from qrun.backends.loading import ensure_converted, locate_model

SERVER_START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def vllm_serve(log_folder: Path) -> Iterator[str]:
    """The URL of a `vllm serve` of SmolLM2 (its log in `log_folder`), stopped on exit."""
    folder = ensure_converted(locate_model("smollm2"))
    port = free_port()
    log = log_folder / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
        "--block-size", "32", "--enable-prefix-caching", "--enforce-eager",
        "--dtype", "float32",  # as the local engines here (vLLM's CPU default is bfloat16)
        "--enable-prompt-tokens-details",
    ]
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"vllm serve exited ({server.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vllm serve did not start:\n{log.read_text()[-3000:]}")
                time.sleep(2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
