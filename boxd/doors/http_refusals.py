"""Requests aiohttp refuses before any route sees them, answered in the API's shape.

aiohttp's HTTP parser refuses a request line or header over 8190 bytes, a header it cannot read,
a body cut short or badly chunked, and answers on its own, below every middleware: text/plain
with the parser's insides in it ("Got more than 8190 bytes when reading: bytearray(b'/aaa...')").
docs/spec/broker-api.txt and the HTTP API promise `{"error": "..."}` for every refusal, so those
answers are rewritten here, once for every aiohttp server in the process: the same status, and
words that say what to change. aiohttp has no hook for this answer but its request handler's
handle_error, so that one method is wrapped: a refusal closes the connection as aiohttp's does,
and is logged as a debug line, not as aiohttp's traceback, which a stranger could fill the
journal with.
"""

import re
from http import HTTPStatus
from typing import Any

from aiohttp import http_exceptions
from aiohttp.web import Response, StreamResponse, json_response
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

_aiohttp_answer = RequestHandler.handle_error
LONGEST_LINE = 8190
# How aiohttp's parsers (C and Python alike) name a header that may be sent once and came twice.
_TWICE = re.compile(r"Duplicate '([A-Za-z-]{1,40})' header")


def words(status: int, failure: BaseException | None) -> str:
    """What was wrong with a request the HTTP parser could not read, in plain words."""
    if isinstance(failure, http_exceptions.LineTooLong):
        return (
            f"the request's address or one of its headers is over {LONGEST_LINE} bytes: "
            "send a shorter one"
        )
    if isinstance(failure, http_exceptions.InvalidHeader):
        return "a header of the request cannot be read: send each header as Name: value"
    twice = _TWICE.search(str(getattr(failure, "message", "")))
    if isinstance(failure, http_exceptions.BadHttpMessage) and twice:
        # Host above all: a proxy in between may read the other one, so which name the request
        # was meant for is not known.
        return f"the request sends its {twice[1]} header more than once: send it once"
    if isinstance(failure, http_exceptions.BadHttpMethod):
        return "the request does not start with an HTTP method such as GET or POST"
    if isinstance(failure, http_exceptions.InvalidURLError):
        return "the request's address cannot be read: percent-encode what is not plain text"
    if isinstance(failure, http_exceptions.ContentEncodingError):
        return "the body cannot be decompressed as its Content-Encoding says: send it as it is"
    if isinstance(failure, http_exceptions.PayloadEncodingError):
        return "the body ended before its Content-Length or its last chunk"
    if status == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        return "the request has too many headers, or headers too long"
    if 400 <= status < 500:
        return f"the request is not HTTP/1.1 this server can read ({HTTPStatus(status).phrase})"
    return f"the server could not answer this request ({HTTPStatus(status).phrase})"


def _handle_error(
    self: RequestHandler,
    request: BaseRequest,
    status: int = 500,
    exc: BaseException | None = None,
    message: str | None = None,
) -> StreamResponse:
    if isinstance(exc, ConnectionResetError) and request.writer.output_size > 0:
        # An answer under way whose connection broke: its client hung up, or it was cut off on
        # purpose (boxd.doors.json_pages). No fault of the server's, and nothing more can be sent.
        self.log_debug("an answer under way was cut off: %r", exc)
        raise ConnectionError("the answer was cut off, so no error can be sent on it")
    if 400 <= status < 500:
        # A client's garbage is no fault of the server's: a line for debugging, never a
        # traceback in the journal (aiohttp logs one for each).
        self.log_debug("refused a request it could not read: %r", exc)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was sent already, so the refusal cannot be")
        refused = json_response({"error": words(status, exc)}, status=status)
    else:
        answer: Any = _aiohttp_answer(self, request, status, exc, message)
        if not isinstance(answer, Response) or answer.content_type == "application/json":
            return answer  # type: ignore[no-any-return]
        refused = json_response({"error": words(answer.status, exc)}, status=answer.status)
    refused.force_close()
    return refused


def install() -> None:
    """Called by json_errors for every server it serves; the second call changes nothing."""
    RequestHandler.handle_error = _handle_error  # type: ignore[method-assign]
