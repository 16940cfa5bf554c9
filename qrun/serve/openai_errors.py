"""Errors of qrun serve's OpenAI endpoints in OpenAI's shape (`{"error": {"message", "type",
"param", "code"}}`), with the statuses the `openai` SDK maps to its exception classes
(docs/serve.md §2.7): shared by the modules that read requests (serve/openai_protocol.py,
serve/openai_tools.py) and the one that answers them (serve/openai.py)."""

from __future__ import annotations

from typing import Any

from qrun.serve.protocol import ApiError


class OpenAIError(ApiError):
    """An ApiError that names the request's field it is about (OpenAI's `param`)."""

    def __init__(self, status: int, code: str, message: str, param: str | None) -> None:
        super().__init__(status, code, message)
        self.param = param


def bad(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, "invalid_request_error", message, param)


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "invalid_request_error",
               408: "invalid_request_error", 413: "invalid_request_error",
               415: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error"}


def openai_error(error: ApiError) -> dict[str, Any]:
    """`error` in OpenAI's shape; `code` is qrun's stable code (docs/serve.md §4)."""
    return {"error": {"message": error.message,
                      "type": ERROR_TYPES.get(error.status, "server_error"),
                      "param": error.param if isinstance(error, OpenAIError) else None,
                      "code": error.code}}
