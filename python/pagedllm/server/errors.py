"""Errors in OpenAI's JSON shape, and the handlers that turn every failure into one.

Every non-2xx answer of the server has the body OpenAI's API uses, which its clients parse::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": null}}
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("pagedllm.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          503: "service_unavailable_error"}


class OpenAIError(Exception):
    """A failure to report to the client.

    Args:
        status: the HTTP status (4xx for the client's mistakes, 5xx for ours).
        message: what is wrong and, where it helps, what to do.
        param: the request field at fault, if one is.
        code: a machine-readable code (OpenAI's, e.g. "invalid_api_key"), if any.
        type: overrides the type derived from the status.
    """

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 code: Optional[str] = None, type: Optional[str] = None):
        message, param = _printable(message), _printable(param)
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else
                                       "invalid_request_error")

    def body(self) -> Dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        """A JSONResponse carrying this error."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _printable(text: Optional[str]) -> Optional[str]:
    """`text` with anything UTF-8 cannot encode (lone surrogates a client sent, quoted back in
    the message) written as a backslash escape, so the error itself can always be sent."""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(message: str, param: Optional[str] = None) -> OpenAIError:
    """A 400 invalid_request_error."""
    return OpenAIError(400, message, param)


_JSON_KINDS = {"list": "array", "str": "string", "int": "number", "float": "number",
               "bool": "boolean", "NoneType": "null"}
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "constrained-int",
              "constrained-float", "constrained-str"}


def _is_union_tag(part) -> bool:
    """True for the parts pydantic adds to a location to say which member of a Union failed
    ('str', 'list[constrained-int]', ...): they are types, not fields."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part
                                      or part.startswith("function-"))


def _is_type_error(error: dict) -> bool:
    kind = str(error.get("type", ""))
    return kind.endswith("_type") or kind.endswith("_parsing") or kind == "missing"


def validation_error(exc: RequestValidationError,
                     content_type: Optional[str] = None) -> OpenAIError:
    """A 400 naming the invalid field of a request body.

    When a field accepts several types (``prompt``: text, texts, token ids, ...), the error that
    says what is wrong with a value of the right type (a token id out of range) wins over the
    ones that only say another type was expected. A body that is missing, not JSON or not a
    JSON object is said so (with the Content-Type to send when that was the cause).

    Args:
        exc: the validation error.
        content_type: the request's Content-Type header (None: unknown).
    """
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    if any(e.get("type") == "json_invalid" for e in errors):
        first = next(e for e in errors if e.get("type") == "json_invalid")
        return bad_request(f"the body is not valid JSON ({first.get('msg', '')}; send a UTF-8 "
                           f"JSON object)")
    whole = [e for e in errors if tuple(e.get("loc", ())) == ("body",)]
    if whole:
        is_json = content_type is not None and "json" in content_type.lower()
        if not is_json:
            return bad_request("the body was not read as JSON: send a JSON object with the "
                               "header 'Content-Type: application/json'")
        if whole[0].get("type") == "missing":
            return bad_request("the request body is empty: send a JSON object")
        got = type(whole[0].get("input")).__name__
        return bad_request(f"the body must be a JSON object, got a JSON "
                           f"{_JSON_KINDS.get(got, got)}")
    first = min(errors, key=_is_type_error)  # min keeps the first of equals
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_union_tag(p)]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    where = f"{param}: " if param else ""
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return bad_request(f"{where}{msg}{more}", param)


def install_error_handlers(app: FastAPI) -> None:
    """Makes every error the app raises answer in OpenAI's shape."""

    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc, request.headers.get("content-type")).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else "request failed"
        return OpenAIError(exc.status_code, detail).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error while serving a request")
        return OpenAIError(500, f"internal server error: {type(exc).__name__}").response()
