"""Serving the app with uvicorn (`qrun serve`, qrun/cli/command.py): the address checks of
docs/serve.md §5 and the log format with request ids."""

from __future__ import annotations

import ipaddress
import logging
import sys

import uvicorn
from starlette.applications import Starlette

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """`host` is reachable from this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run_server(asgi: Starlette, host: str = "127.0.0.1", port: int = 8000,
               api_key: str | None = None, log_level: str = "info") -> None:
    """Serve `asgi` until interrupted; binding beyond loopback without a key warns on
    stderr (anyone who reaches the port can run the templates)."""
    if not is_loopback(host) and not api_key:
        print(f"qrun serve: warning: {host} is reachable from other machines and no "
              "--api-key (or QRUN_API_KEY) is set: anyone who reaches it can run these "
              "templates", file=sys.stderr)
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    uvicorn.run(asgi, host=host, port=port, log_level=log_level)
