"""`headline`: a Ratchet stage written in Python, built with componentize-py.

Asks the model for a headline for the draft and proposes exactly its answer.
"""
import wit_world
from componentize_py_types import Err
from wit_world.imports import log, model
from wit_world.imports.types import (
    Artifact,
    StageContext,
    StageError_Fatal,
    StageError_Retryable,
)

MANIFEST = """\
name = "headline"
version = "1.0.0"
description = "Python stage: asks the model for a headline for the draft."
inputs = ["draft"]
outputs = ["headline"]
capabilities = ["model", "log"]
[limits]
timeout_ms = 60000
memory_mb = 256
"""


class WitWorld(wit_world.WitWorld):
    def describe(self) -> str:
        return MANIFEST

    def run(self, ctx: StageContext, inputs: list[Artifact]) -> list[Artifact]:
        draft = next((a for a in inputs if a.name == "draft"), None)
        if draft is None:
            raise Err(StageError_Fatal("missing input `draft`"))
        try:
            text = draft.bytes.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Err(StageError_Fatal(f"input `draft` is not UTF-8: {e}"))

        log.log(log.Level.INFO, f"attempt {ctx.attempt} writing a headline")
        request = model.Request(
            messages=[model.Message(model.Role.USER, "Write a headline for: " + text)],
            model=None,
            temperature=None,
            top_p=None,
            stop=[],
            max_tokens=None,
            response_format=model.ResponseFormat_Text(),
        )
        try:
            answer = model.generate(request)
        except Err as e:
            retry = isinstance(e.value, model.ModelError_Unavailable)
            raise Err((StageError_Retryable if retry else StageError_Fatal)(e.value.value))
        return [Artifact("headline", "text/plain; charset=utf-8", answer.text.encode("utf-8"))]
