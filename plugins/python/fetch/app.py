"""`research-fetch-py`: the research example's fetch stage, in Python.

Fetches the URL the run was given through WASI's `wasi:http` (the host's
`http` capability), sending the operator's search key as
`{{secret:search}}`: the host fills it in on the way out and journals the
response, so a retry after a crash is handed the recorded page and the
server is asked once.
"""
import json
from urllib.parse import urlsplit

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import log, outgoing_handler, streams
from wit_world.imports import wasi_http_types as http
from wit_world.imports.ratchet_stage_types import (
    Artifact,
    StageContext,
    StageError_Fatal,
    StageError_Retryable,
)

MANIFEST = """\
name = "research-fetch-py"
version = "1.0.0"
description = "The research example's fetch, in Python: the page the run asks about, with the operator's search key."
inputs = ["url"]
outputs = ["page"]
capabilities = ["http", "log"]
allowed_hosts = ["127.0.0.1:*", "*.wikipedia.org"]
[limits]
timeout_ms = 60000
memory_mb = 256
"""


def fetch(url: str, headers: list[tuple[str, bytes]]) -> tuple[int, dict[str, str], bytes]:
    """GETs `url` and waits for the whole response."""
    parts = urlsplit(url)
    request = http.OutgoingRequest(http.Fields.from_list(headers))
    request.set_method(http.Method_Get())
    request.set_scheme(http.Scheme_Https() if parts.scheme == "https" else http.Scheme_Http())
    request.set_authority(parts.netloc)
    request.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    future = outgoing_handler.handle(request, None)
    with future.subscribe() as ready:
        ready.block()
    outcome = future.get()
    if not isinstance(outcome, Ok) or not isinstance(outcome.value, Ok):
        code = outcome.value.value if isinstance(outcome, Ok) else outcome
        denied = isinstance(code, http.ErrorCode_HttpRequestDenied)
        fail = StageError_Fatal if denied else StageError_Retryable
        raise Err(fail(f"GET {url}: {type(code).__name__}"))
    response = outcome.value.value
    status = response.status()
    with response.headers() as fields:
        names = {name: value.decode("utf-8", "replace") for name, value in fields.entries()}
    body = bytearray()
    incoming = response.consume()
    with incoming.stream() as stream:
        while True:
            try:
                body += stream.blocking_read(65536)
            except Err as e:
                if isinstance(e.value, streams.StreamError_Closed):
                    break
                raise Err(StageError_Retryable(f"GET {url}: the body broke off"))
    return status, names, bytes(body)


class WitWorld(wit_world.WitWorld):
    def describe(self) -> str:
        return MANIFEST

    def run(self, ctx: StageContext, inputs: list[Artifact]) -> list[Artifact]:
        given = next((a for a in inputs if a.name == "url"), None)
        if given is None:
            raise Err(StageError_Fatal("missing input `url`"))
        url = given.bytes.decode("utf-8").strip()
        status, headers, body = fetch(
            url,
            [
                ("accept", b"text/html, text/plain"),
                ("authorization", b"Bearer {{secret:search}}"),
                ("idempotency-key", ctx.idempotency_key.encode("utf-8")),
            ],
        )
        log.log(log.Level.INFO, f"fetched {url}: {status}")
        if status >= 500 or status == 429:
            raise Err(StageError_Retryable(f"{url} answered {status}"))
        if not 200 <= status < 300:
            raise Err(StageError_Fatal(f"{url} answered {status}"))
        page = {
            "url": url,
            "status": status,
            "content_type": headers.get("content-type"),
            "text": body.decode("utf-8", "replace"),
        }
        return [Artifact("page", "application/json", json.dumps(page).encode("utf-8"))]
