"""`qrun serve` (docs/serve.md): templates as an HTTP service. `qrun.serve.app(...)` is the
ASGI app, for embedding in an existing service (ServeOptions checks its limits, for the command
line too); `run_server` serves it with uvicorn, on a DrainingServer (SIGTERM drains it).
Imports Starlette and uvicorn, so `import qrun` does not load this package."""

from qrun.serve.application import app
from qrun.serve.protocol import ServeOptions
from qrun.serve.server import DrainingServer, allowed_hosts, run_server

__all__ = ["DrainingServer", "ServeOptions", "allowed_hosts", "app", "run_server"]
