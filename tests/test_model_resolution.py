"""The ingress's resolution of a request's ``model`` (``llmtrio.web._models``), pure: the four
rules and the rule for an omitted or empty model, in OpenAI's error shapes."""

from __future__ import annotations

import pytest

from llmtrio._openai_errors import OpenAIError
from llmtrio._routes import CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH
from llmtrio.ring import ModelStats
from llmtrio.web._models import requested_model, resolve_model

CHATS = {"gemma": ModelStats("gemma", "chat", 2), "qwen": ModelStats("qwen", "chat", 0)}
MINILM = {"minilm": ModelStats("minilm", "embedding", 1)}
BOTH = CHATS | MINILM


def refused(requested: object, path: str, models: dict[str, ModelStats], **kw: object) -> dict:
    with pytest.raises(OpenAIError) as info:
        resolve_model(requested, path, models, **kw)  # type: ignore[arg-type]
    return {"status": info.value.status, **info.value.to_dict()["error"]}


def test_rule_1_a_model_served_now_or_lately_is_routed_to() -> None:
    assert resolve_model("gemma", CHAT_PATH, BOTH, None) == "gemma"
    assert resolve_model("qwen", COMPLETIONS_PATH, BOTH, "gemma") == "qwen"  # 0 workers: parks
    assert resolve_model("minilm", EMBEDDINGS_PATH, BOTH, "gemma") == "minilm"


def test_rule_2_a_model_of_the_other_kind_is_a_400_naming_it() -> None:
    error = refused("minilm", CHAT_PATH, BOTH, default="gemma")
    assert error["status"] == 400 and error["param"] == "model"
    assert "'minilm' is an embedding model" in error["message"]
    assert "/v1/embeddings" in error["message"]
    error = refused("gemma", EMBEDDINGS_PATH, BOTH, default=None)
    assert error["status"] == 400 and "chat and completion model" in error["message"]


def test_rule_3_an_unknown_model_goes_to_the_default() -> None:
    assert resolve_model("gpt-4o", CHAT_PATH, BOTH, "gemma") == "gemma"
    # a default not attached (yet) still takes it: it parks until its worker comes
    assert resolve_model("gpt-4o", CHAT_PATH, {}, "gemma") == "gemma"
    # a default of the other kind does not take it
    assert refused("ada-002", EMBEDDINGS_PATH, BOTH, default="gemma")["status"] == 404


def test_rule_4_otherwise_404_model_not_found_in_openais_shape() -> None:
    assert refused("gpt-4o", CHAT_PATH, BOTH, default=None) == {
        "status": 404,
        "message": "The model `gpt-4o` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


@pytest.mark.parametrize("requested", [None, ""])
def test_no_model_named(requested: object) -> None:
    assert resolve_model(requested, CHAT_PATH, BOTH, "qwen") == "qwen"  # the default
    # one chat model and one embedding model: each endpoint has its one model
    one_chat = {"gemma": CHATS["gemma"]} | MINILM
    assert resolve_model(requested, CHAT_PATH, one_chat, None) == "gemma"
    assert resolve_model(requested, EMBEDDINGS_PATH, one_chat, None) == "minilm"
    error = refused(requested, CHAT_PATH, BOTH, default=None)
    assert (error["status"], error["code"], error["param"]) == (
        400,
        "missing_required_parameter",
        "model",
    )
    assert "'gemma', 'qwen'" in error["message"]
    assert refused(requested, EMBEDDINGS_PATH, CHATS, default=None)["status"] == 400
    # nothing attached yet: parks unrouted (503 no_worker after the park timeout, as before)
    assert resolve_model(requested, CHAT_PATH, {}, None) == ""


def test_a_worker_listing_no_model_takes_any_name() -> None:
    assert resolve_model("anything", CHAT_PATH, {}, None, takes_any=True) == "anything"
    assert refused("anything", CHAT_PATH, {}, default=None)["status"] == 404


def test_a_model_that_is_not_a_string_is_a_400() -> None:
    error = refused(["gemma"], CHAT_PATH, BOTH, default="gemma")
    assert (error["status"], error["param"]) == (400, "model")


def test_requested_model_reads_the_body_and_nothing_else() -> None:
    assert requested_model(b'{"model": "gemma", "messages": []}') == "gemma"
    assert requested_model(b'{"messages": []}') is None
    assert requested_model(b"not json") is None
    assert requested_model(b"[1, 2]") is None
    assert requested_model(b'{"model": 3}') == 3
