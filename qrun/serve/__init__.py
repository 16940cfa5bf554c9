"""`qrun serve` (docs/serve.md): templates as an HTTP service. `qrun.serve.app(...)` is the
ASGI app, for embedding in an existing service; `run_server` serves it with uvicorn. Imports
Starlette and uvicorn, so `import qrun` does not load this package."""

from qrun.serve.app import app
from qrun.serve.server import run_server

__all__ = ["app", "run_server"]
