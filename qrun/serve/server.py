"""Serving the app with uvicorn (`qrun serve`, qrun/cli/command.py): the address checks of
docs/serve.md §5, the log format with request ids, and the drain on SIGTERM."""

from __future__ import annotations

import ipaddress
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from qrun.serve.connections import HEADER_TIMEOUT_S, MAX_CONNECTIONS, bounded_config
from qrun.serve.service import LOOPBACK_HOSTS, Service, host_name

log = logging.getLogger("qrun.serve")

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """`host` is reachable from this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, given: Sequence[str]) -> frozenset[str] | None:
    """The names `qrun serve --host HOST --allow-host NAME...` answers to in `Host`
    (service.HostGate): this machine's loopback names, the bound address, and those given;
    bound to every interface with none given, any name (None)."""
    if not given and host in ("0.0.0.0", "::", ""):
        return None
    return LOOPBACK_HOSTS | {host_name(host)} | {host_name(name) for name in given}


class DrainingServer(uvicorn.Server):
    """uvicorn's server with qrun serve's shutdown (docs/serve.md §5, issue #26 item 7): the
    first SIGTERM or Ctrl-C does not close the listening socket (uvicorn's own shutdown would:
    new connections refused) but drains: `service` answers each new request 503 `draining`
    (qrun/serve/application.py DrainGate) while the accepted ones, queued and running, go on;
    once they are all answered, or `drain_timeout` seconds have passed and the runs left have been
    cancelled (each answered 503 `draining`), uvicorn shuts down (up to `CLOSE_GRACE_S` more
    for the last responses to be sent). A second signal shuts down at once as uvicorn does."""

    CLOSE_GRACE_S = 5

    def __init__(self, config: uvicorn.Config, service: Service, drain_timeout: float) -> None:
        super().__init__(config)
        self.service = service
        self.drain_timeout = drain_timeout
        self.signalled_at: float | None = None  # set by the signal handler only
        self.drain_ends: float | None = None
        self.abandoned_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: it only records the time; the loop's next tick acts on it (the
        # scheduler's lock may be held by the very frame this interrupts).
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        else:
            super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            if self.signalled_at is not None and self.abandoned_at is None:
                self.service.abandon()  # a second signal: answer what is left, then go
            return True
        if self.signalled_at is None:
            return False
        now = time.monotonic()
        if self.drain_ends is None:
            self.drain_ends = self.signalled_at + self.drain_timeout
            self.service.drain()
            log.info("draining: %d request(s) in flight, up to %s s", self.service.in_flight,
                     self.drain_timeout)
        if self.service.drained:
            return True
        if self.abandoned_at is not None and self.service.in_flight == 0:
            return True  # every request is answered; a run still in a host function is not
        if self.abandoned_at is None and now >= self.drain_ends:
            log.warning("the drain timeout passed: cancelling %d run(s)",
                        self.service.runs.active + self.service.runs.queued)
            self.abandoned_at = now
            self.service.abandon()
        # Past the drain, a run stuck in a host function does not keep the process forever.
        return self.abandoned_at is not None and now >= self.abandoned_at + self.CLOSE_GRACE_S


def run_server(asgi: Starlette, host: str = "127.0.0.1", port: int = 8000,
               api_key: str | None = None, log_level: str = "info",
               drain_timeout: float = 30, header_timeout: float = HEADER_TIMEOUT_S,
               max_connections: int = MAX_CONNECTIONS) -> None:
    """Serve `asgi` (an app of `qrun.serve.app`) until SIGTERM or Ctrl-C, then drain it
    (DrainingServer: new requests answered 503 while those accepted finish, for up to
    `drain_timeout` seconds) and return. Binding beyond loopback without a key warns on stderr
    (anyone who reaches the port can run the templates). Connections are bounded
    (serve/connections.py): headers within `header_timeout` seconds, at most
    `max_connections` open."""
    if not is_loopback(host) and not api_key:
        print(f"qrun serve: warning: {host} is reachable from other machines and no "
              "--api-key (or QRUN_API_KEY) is set: anyone who reaches it can run these "
              "templates", file=sys.stderr)
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if threading.current_thread() is threading.main_thread():
        # uvicorn raises a signal that made it shut down (a second one, DrainingServer) again
        # once it has: with the default SIGTERM handler the process would die of it (status
        # -15); this one lets `qrun serve` exit 0 (docs/serve.md §5).
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
    config = bounded_config(asgi, host, port, header_timeout=header_timeout,
                            max_connections=max_connections, log_level=log_level,
                            timeout_graceful_shutdown=DrainingServer.CLOSE_GRACE_S)
    DrainingServer(config, asgi.state.qrun, drain_timeout).run()
