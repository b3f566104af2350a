"""How the api says no: the exception handlers that turn every failure into an `Error` body
naming the field and the value, the HTTP status of each refusal's code, and the error responses
the routes document.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal, TypeVar, get_args, get_origin

import msgspec
import structlog
from litestar import Request, Response
from litestar.exceptions import (
    ClientException,
    HTTPException,
    SerializationException,
    ValidationException,
)
from litestar.openapi.datastructures import ResponseSpec
from litestar.utils.scope.state import ScopeState

from events.commands import in_words
from services.api.types import Error
from services.runtime.postgres import PG_TRANSIENT

log = structlog.get_logger("fairlane.api")


def _error(status: int, message: str, field: str | None = None) -> Response[Error]:
    return Response(Error(error=message, status=status, field=field), status_code=status)


#: Parameters whose Python name is not the one on the wire.
_ALIASES: Final = {
    "job_state": "state",
    "types": "type",
    "last_event_id": "Last-Event-ID",
    "first": "from",
    "last": "to",
    "data": "body",  # Litestar's name for a route's body
}
#: The largest request body the API reads: a job's whole spec is at most 64 KiB
#: (`events.commands.MAX_SPEC_BYTES`), every other body a few hundred bytes. (Litestar's own
#: default, 10 MB, was read whole before the spec's bound refused it.)
MAX_BODY_BYTES: Final = 1 << 20
#: Where Litestar says the body lacks a field: the field is named as the error's `field`.
_MISSING: Final = re.compile(r"Object missing required field `(\w+)`")


def on_http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Error]:
    field, message = None, exc.detail
    if exc.status_code == 413:  # Litestar says only "Request Entity Too Large"
        return _error(413, f"the body is over the {MAX_BODY_BYTES:,} bytes it may be", "body")
    if isinstance(exc, ValidationException) and isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict):
            key = str(first.get("key", ""))
            field = _ALIASES.get(key, key) or None
            said = in_words(str(first.get("message", exc.detail)))
            source = _source(first.get("source"))
            if field == "body" and said == "'data'":  # (Litestar's KeyError: no body at all)
                said = "a JSON body is needed"
            elif field == "body" and (missing := _MISSING.search(said)):
                field = missing.group(1)
            if source == "body":
                given = _given(_body_read(request), field)
            else:
                given = _given_parameter(request, source, key, field or key)
            if said.startswith("Invalid enum value"):
                given += _choices(request, "data" if source == "body" else key, field)
            message = f"{said}{given} (in {source})"
            if field:  # the message names the field too: not every client shows `field`
                message = f"{field}: {message}"
    elif isinstance(exc, ClientException) and isinstance(exc.__cause__, SerializationException):
        # a body that is not JSON ("Input data was truncated", "Number out of range"): said as
        # on_other_error says the others, naming the body
        return _error(400, f"the body is not JSON this API reads: {exc.detail}", "body")
    elif isinstance(exc.extra, dict):
        field = exc.extra.get("field")
    return _error(exc.status_code, message, field)


def _given_parameter(request: Request[Any, Any, Any], source: str, key: str, wire_name: str) -> str:
    """`, given <value>` for a query or path parameter (`key` its Python name, `wire_name` the
    request's), as `_given` for the body's fields (a header's value is never repeated: it may
    be a token)."""
    if source == "query":
        values = request.query_params.getall(wire_name, [])
        value = values[0] if values else None
    elif source == "path":
        value = request.scope.get("path_params", {}).get(key)
    else:
        return ""
    if not isinstance(value, str):
        return ""
    shown = msgspec.json.encode(value).decode()
    return f", given {shown[:60]}{'…' if len(shown) > 60 else ''}"


def _choices(request: Request[Any, Any, Any], key: str, field: str | None) -> str:
    """`; one of ...` for a value that must be one of some words: a query or path parameter
    (`key`, its Python name) or a field of the body (`key` "data", `field` its name), read
    from the route's own signature and body type. msgspec says only that the value is not one
    of them."""
    handler = request.scope.get("route_handler")
    signature = getattr(handler, "parsed_fn_signature", None)
    parameter = signature.parameters.get(key) if signature is not None else None
    if parameter is None:
        return ""
    kinds = [kind.annotation for kind in (parameter, *parameter.inner_types)]
    if key == "data":  # the body: the type of its struct's field of that name
        body = next(
            (k for k in kinds if isinstance(k, type) and issubclass(k, msgspec.Struct)), None
        )
        if body is None:
            return ""
        types = {f.encode_name: f.type for f in msgspec.structs.fields(body)}
        kinds = [types.get(field or ""), *get_args(types.get(field or ""))]
    words = next((get_args(kind) for kind in kinds if get_origin(kind) is Literal), ())
    return "; one of " + ", ".join(map(str, words)) if words else ""


def _source(source: object) -> str:
    """Where a bad value was: the body, or a query, path or header parameter."""
    if source is None:
        return "the request"
    return str(getattr(source, "value", source))


#: Where msgspec says a value broke a command's bounds: "... - at `$.limit`".
_AT_FIELD: Final = re.compile(r" - at `\$\.(\w+)")


def on_other_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Error]:
    if isinstance(exc, SerializationException | RecursionError | UnicodeDecodeError):
        said = str(exc) or type(exc).__name__
        return _error(400, f"the body is not JSON this API reads: {said}", "body")
    if isinstance(exc, msgspec.ValidationError):  # a request's values broke a command's bounds
        at = _AT_FIELD.search(str(exc))
        return _error(400, str(exc), at.group(1) if at else None)
    if isinstance(exc, PG_TRANSIENT):
        return _error(503, f"the read models are unavailable just now: {exc}")
    log.exception("request failed", path=request.url.path)
    return _error(500, f"internal error: {type(exc).__name__}")


Body = TypeVar("Body", bound=msgspec.Struct)


async def strictly(request: Request[Any, Any, Any], body_type: type[Body]) -> Body:
    """The body decoded again with msgspec's strict rules: Litestar converts a body loosely,
    taking `"gpus": "1"` for 1, and a command's types are exact (JSON says what it means)."""
    body = await request.body()
    try:
        return msgspec.json.decode(body, type=body_type)
    except msgspec.ValidationError as e:
        at = _AT_FIELD.search(str(e))
        field = at.group(1) if at else None
        said = f"{in_words(str(e))}{_given(body, field)} (in body)"
        raise fail(400, f"{field}: {said}" if field else said, field) from None


def _body_read(request: Request[Any, Any, Any]) -> bytes:
    """The body as Litestar read it before it refused a value (nothing when it read none)."""
    body = ScopeState.from_scope(request.scope).body
    return body if isinstance(body, bytes) else b""


def _given(body: bytes, field: str | None) -> str:
    """`, given <value>` for a top-level field of the body, so the error names the value too
    (msgspec's message names only the bound); the value is cut short, the body is untrusted."""
    if field is None or not body:
        return ""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return ""
    if not isinstance(raw, dict) or field not in raw:
        return ""
    shown = msgspec.json.encode(raw[field]).decode()
    return f", given {shown[:60]}{'…' if len(shown) > 60 else ''}"


def fail(status: int, message: str, field: str | None = None) -> HTTPException:
    return HTTPException(status_code=status, detail=message, extra={"field": field})


ERRORS: Final = {
    400: ResponseSpec(Error, description="a value is malformed (`field` names it)"),
    401: ResponseSpec(Error, description="no token, or an unknown one"),
    503: ResponseSpec(Error, description="the cluster or the read models are unavailable"),
}
ACT_ERRORS: Final = {
    **ERRORS,
    403: ResponseSpec(Error, description="the token may not act on this project"),
    404: ResponseSpec(Error, description="no such job"),
    422: ResponseSpec(Error, description="refused by admission or the ledger (says why)"),
}
ADMIN_ERRORS: Final = {
    **ERRORS,
    403: ResponseSpec(Error, description="an admin token is needed"),
    422: ResponseSpec(Error, description="refused by the ledger (says why)"),
}
FOUND_ERRORS: Final = {
    **ERRORS,
    403: ResponseSpec(Error, description="the token does not cover the project (names it)"),
    404: ResponseSpec(Error, description="not found"),
}
AUDIT_ERRORS: Final = {
    **FOUND_ERRORS,
    422: ResponseSpec(Error, description="too long a log for the API (use `fairlane audit`)"),
}


#: The HTTP status of each refusal's code (`events.refusals.RefusalCode`, every one of them):
#: the one place a refusal becomes a status. Keyed by plain strings, as the reply carries it.
REFUSAL_STATUS: Final[dict[str, int]] = {
    "invalid_name": 422,
    "out_of_range": 422,
    "bad_port": 422,
    "unknown_project": 422,
    "unknown_pool": 422,
    "unknown_node": 422,
    "unknown_class": 422,
    "not_found": 404,
    "name_taken": 422,
    "never_fits": 422,
    "over_limit": 422,
    "not_in_pool": 422,
    "no_pool": 422,
    "wrong_phase": 422,
    "no_change": 422,
    "not_taken_here": 500,
    "ended": 422,
    "bad_volume": 422,
    "not_allowed": 422,
}
#: A refusal without a code (stored, or answered by a service, before codes were), or with
#: one this build does not know: refused as a request the cluster cannot carry out.
UNCODED_STATUS: Final = 422
