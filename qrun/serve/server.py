"""Serving the app with uvicorn (`qrun serve`, qrun/cli/command.py): the address checks of
docs/serve.md §5 and the log format with request ids."""

from __future__ import annotations

import ipaddress
import logging
import signal
import sys
import threading

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
               api_key: str | None = None, log_level: str = "info",
               drain_timeout: int = 30) -> None:
    """Serve `asgi` until SIGTERM or Ctrl-C, then stop accepting connections and let the
    requests in flight finish for up to `drain_timeout` seconds (uvicorn's graceful
    shutdown; then the app's lifespan cancels what is left). Binding beyond loopback without
    a key warns on stderr (anyone who reaches the port can run the templates)."""
    if not is_loopback(host) and not api_key:
        print(f"qrun serve: warning: {host} is reachable from other machines and no "
              "--api-key (or QRUN_API_KEY) is set: anyone who reaches it can run these "
              "templates", file=sys.stderr)
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if threading.current_thread() is threading.main_thread():
        # uvicorn raises the signal that stopped it again once it has shut down: with the
        # default SIGTERM handler the process would die of it (status -15) after draining;
        # this one lets `qrun serve` exit 0 (docs/serve.md §5).
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uvicorn.run(asgi, host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=drain_timeout)
