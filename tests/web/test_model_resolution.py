"""The ingress's resolution of a request's ``model`` (``llmtrio.web._models``), pure: the four
rules and the rule for an omitted or empty model, in OpenAI's error shapes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from llmtrio.api import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DETOKENIZE_PATH,
    EMBEDDINGS_PATH,
    OPENAI_ERRORS,
    RERANK_PATH,
    RERANK_V2_PATH,
    SCORE_PATH,
    TOKENIZE_PATH,
    ApiError,
)
from llmtrio.cli._configs import engine_configs
from llmtrio.cli._threads import split_threads, thread_counts
from llmtrio.cli._values import ModelSpec, threads_value
from llmtrio.ring import ModelStats
from llmtrio.web._models import requested_model, resolve_model

CHATS = {"gemma": ModelStats("gemma", "chat", 2), "qwen": ModelStats("qwen", "chat", 0)}
MINILM = {"minilm": ModelStats("minilm", "embedding", 1)}
BOTH = CHATS | MINILM


def refused(requested: object, path: str, models: dict[str, ModelStats], **kw: object) -> dict:
    with pytest.raises(ApiError) as info:
        resolve_model(requested, path, models, **kw)  # type: ignore[arg-type]
    return {"status": info.value.status, **OPENAI_ERRORS.to_dict(info.value)["error"]}


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


def test_a_reranking_model_serves_the_reranking_routes_only() -> None:
    three = BOTH | {"ranker": ModelStats("ranker", "rerank", 1)}
    for path in (RERANK_PATH, RERANK_V2_PATH, SCORE_PATH):
        assert resolve_model(None, path, three, None) == "ranker"  # the one of its kind
        assert resolve_model("ranker", path, three, "gemma") == "ranker"
        error = refused("minilm", path, three, default=None)
        assert (error["status"], error["code"]) == (400, "model_not_supported")
        assert "'minilm' is an embedding model" in error["message"]
    for path in (CHAT_PATH, EMBEDDINGS_PATH):
        error = refused("ranker", path, three, default=None)
        assert (error["code"], error["param"]) == ("model_not_supported", "model")
        assert "'ranker' is a reranking model: it serves /v1/rerank" in error["message"]
    # none of the endpoint's kind attached: each other model is named with what it serves
    error = refused(None, RERANK_PATH, BOTH, default=None)
    assert error["code"] == "missing_required_parameter"
    assert "'gemma', 'qwen' serve chat and completion only" in error["message"]
    assert "'minilm' serves embedding only" in error["message"]
    # a newer worker's kind this ingress does not know: routed by name to what takes any kind
    newer = {"x": ModelStats("x", "audio", 1)}
    assert resolve_model("x", TOKENIZE_PATH, newer, None) == "x"
    error = refused("x", CHAT_PATH, newer, default=None)
    assert "'x' is a model of kind 'audio'" in error["message"]


def test_the_tokenizer_routes_take_a_model_of_either_kind() -> None:
    """``/tokenize`` and ``/detokenize`` need no kind: any model named, the default whatever
    its kind, the one model served when none is named; an unknown name is still a 404."""
    for path in (TOKENIZE_PATH, DETOKENIZE_PATH):
        assert resolve_model("minilm", path, BOTH, "gemma") == "minilm"
        assert resolve_model("gemma", path, BOTH, None) == "gemma"
        assert resolve_model("ada-002", path, BOTH, "minilm") == "minilm"
        assert resolve_model(None, path, MINILM, None) == "minilm"
        assert refused("nowhere", path, BOTH, default=None)["status"] == 404
        assert refused(None, path, BOTH, default=None)["code"] == "missing_required_parameter"


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


def test_a_hub_model_is_found_without_its_quant_while_one_quant_is_served() -> None:
    hub = {"org/model-GGUF:Q4_K_M": ModelStats("org/model-GGUF:Q4_K_M", "chat", 1)}
    assert resolve_model("org/model-GGUF", CHAT_PATH, hub, None) == "org/model-GGUF:Q4_K_M"
    two = hub | {"org/model-GGUF:Q8_0": ModelStats("org/model-GGUF:Q8_0", "chat", 1)}
    assert refused("org/model-GGUF", CHAT_PATH, two, default=None)["status"] == 404


def test_model_specs_from_the_command_line(tmp_path: Path) -> None:
    gguf = tmp_path / "tiny-Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    assert ModelSpec.parse(str(gguf)) == ModelSpec(None, path=gguf)
    assert ModelSpec.parse(f"tiny={gguf}") == ModelSpec("tiny", path=gguf)
    assert ModelSpec.parse("org/repo") == ModelSpec(None, hf_repo="org/repo")
    assert ModelSpec.parse("org/repo:Q4_K_M") == ModelSpec(None, hf_repo="org/repo", quant="Q4_K_M")
    assert ModelSpec.parse("x=org/repo:Q8_0") == ModelSpec("x", hf_repo="org/repo", quant="Q8_0")
    assert ModelSpec.parse("missing.gguf").path == Path("missing.gguf")  # a path: never a repo
    with pytest.raises(ValueError, match="NAME=PATH"):
        ModelSpec.parse("=x.gguf")


def test_the_default_threads_split_the_cores_between_the_engines() -> None:
    assert [split_threads(8, n) for n in (1, 2, 3, 8, 20)] == [8, 4, 2, 1, 1]
    assert split_threads(2, 2) == 1


def test_named_thread_counts_leave_the_rest_of_the_cores_to_the_other_models() -> None:
    names = ["chat", "embed", "other"]
    assert thread_counts(names, [], 8) == [2, 2, 2]
    assert thread_counts(names, [("chat", 4)], 8) == [4, 2, 2]
    assert thread_counts(names, [("chat", 6), ("embed", 2)], 8) == [6, 2, 1]  # at least 1
    assert thread_counts(names, [(None, 3), ("embed", 1)], 8) == [3, 1, 3]
    assert thread_counts(names, [(None, 3), (None, 5)], 8) == [5, 5, 5]  # the last plain N
    assert thread_counts(["one"], [], 2) == [2]
    with pytest.raises(ValueError, match="'nope', which is not served"):
        thread_counts(names, [("nope", 1)], 8)


def test_engine_configs_one_per_model(tmp_path: Path) -> None:
    from llmtrio.cli._main import _parser

    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"

    def configs(*argv: str) -> list[tuple[object, ...]]:
        args = _parser().parse_args(["serve", *argv])
        return [(c.model, c.model_name, c.threads) for c in engine_configs(args)]

    cores = os.cpu_count() or 1
    assert configs(f"--model={a}", f"--model=bee={b}") == [
        (a, None, split_threads(cores, 2)),
        (b, "bee", split_threads(cores, 2)),
    ]
    assert configs(f"--model={a}", "--model-name=x", "--threads=3") == [(a, "x", 3)]
    # per model: its own count, the rest of the cores to the others
    assert configs(f"--model={a}", f"--model=bee={b}", "--threads=bee=5")[1] == (b, "bee", 5)
    assert configs(f"--model={a}", f"--model=bee={b}", "--threads=2", "--threads=a=1") == [
        (a, None, 1),
        (b, "bee", 2),
    ]
    with pytest.raises(SystemExit, match="--threads names 'c', which is not served"):
        configs(f"--model={a}", "--threads=c=2")
    for wrong in ("a=two", "=2", "0", "a=0"):
        with pytest.raises(argparse.ArgumentTypeError):
            threads_value(wrong)
    assert threads_value("my=model=3") == ("my=model", 3)
    with pytest.raises(SystemExit, match="--model-name names one model"):
        configs(f"--model={a}", f"--model={b}", "--model-name=x")
    with pytest.raises(SystemExit, match="two models served under one name"):
        configs(f"--model={a}", f"--model=a={b}")


@pytest.mark.parametrize("requested", ["gpt-4o", "", None])
def test_a_default_of_the_other_kind_is_named_where_no_model_fits(requested: object) -> None:
    """One embedding model behind the endpoint (its default): a chat request, whatever model
    it names, is told what the server serves, not that some name does not exist."""
    error = refused(requested, CHAT_PATH, MINILM, default="minilm")
    assert (error["status"], error["code"]) == (400, "model_not_supported")
    assert "'minilm' is an embedding model" in error["message"]
    # where a model of the endpoint's kind is served, an unknown name is still a 404
    if requested:
        assert refused(requested, EMBEDDINGS_PATH, BOTH, default="gemma")["status"] == 404
