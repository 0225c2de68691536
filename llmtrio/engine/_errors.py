"""The engine's exceptions.

EngineError
├── ModelLoadError          the model could not be found, read or loaded (raised at open)
├── RequestError            a request the engine cannot run (raised by ``submit``)
│   ├── PromptTooLongError  the prompt does not fit a slot's context
│   └── InvalidRequestError a bad parameter, message or token id
│       └── GrammarError    a grammar the request gave that llama.cpp cannot parse
├── GrammarBugError         a grammar the engine wrote that llama.cpp cannot parse (a bug)
├── DecodeError             llama_decode failed for this request (carried by ``Failed``)
└── EngineClosedError       the engine closed before or while the request ran
    └── EngineFailedError   the decode loop died: no request runs on this engine again
"""

from __future__ import annotations

__all__ = [
    "DecodeError",
    "EngineClosedError",
    "EngineError",
    "EngineFailedError",
    "GrammarBugError",
    "GrammarError",
    "InvalidRequestError",
    "ModelLoadError",
    "PromptTooLongError",
    "RequestError",
]


class EngineError(Exception):
    """Base class of everything the engine raises."""


class ModelLoadError(EngineError):
    """The model could not be resolved, read or loaded."""


class RequestError(EngineError):
    """A request the engine refuses; ``param`` names the offending field, if any."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(RequestError):
    """The prompt needs more tokens than one request's context holds (a slot's, or the
    shared pool's)."""

    def __init__(self, prompt_tokens: int, ctx_size: int, *, at_least: bool = False) -> None:
        super().__init__(
            f"the prompt is {'at least ' if at_least else ''}{prompt_tokens} tokens, but a "
            f"request's context holds {ctx_size} (at least one token must be left to "
            "generate); shorten the prompt or raise --ctx-size",
            param="messages",
        )
        self.prompt_tokens = prompt_tokens
        self.ctx_size = ctx_size
        #: ``prompt_tokens`` is a lower bound, found without tokenizing the whole prompt.
        self.at_least = at_least


class InvalidRequestError(RequestError):
    """A parameter, message or token id the engine cannot use."""


class GrammarError(InvalidRequestError):
    """A GBNF grammar the request gave that llama.cpp cannot parse."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="response_format")


class GrammarBugError(EngineError):
    """A grammar the engine wrote (from a JSON schema, tools or a text format) that llama.cpp
    cannot parse: the engine's bug, not the request's fault (a server error; the schema is
    logged). A grammar the request gave itself is a :class:`GrammarError`."""


class DecodeError(EngineError):
    """llama_decode failed for the sequence this request was decoding in."""


class EngineClosedError(EngineError):
    """The engine was closed; no request runs on it any more."""


class EngineFailedError(EngineClosedError):
    """The decode loop died (a fault in llama.cpp or a bug); the engine serves nothing more
    and its owner should stop (``llmtrio serve`` exits non-zero)."""
