"""The default model's own tokenizer and chat template, end to end through the engine.

The model is ``tests/_qwen35_real.py``'s: the qwen35 tiny random architecture with Qwen's
151,936-token vocabulary, its added tokens, and the Qwen3.5 chat template. Its weights are
random, so the tests force what must happen (a grammar, a forced tool call, a logit bias) and
assert the tokens, tags and stops that the real template and tokenizer give.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import gguf
import httpx
import jsonschema
import openai
import pytest

from llmtrio.engine import (
    ChatMessage,
    Engine,
    GenerateRequest,
    StopReason,
    Token,
    Tool,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallParser,
    ToolCallStart,
    ToolCallStream,
)
from llmtrio.engine.generate._chat import ChatTemplate
from llmtrio.engine.llama import LlamaModel
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig

from .._helpers import engine_config, events_of, run
from .._qwen35_real import ADDED_TOKENS, QWEN35_TEMPLATE, QWEN35_VOCAB, write_qwen35_real
from .._server import LiveServer, start_server

#: This file's engines: 1 thread (the machine is shared), 2 slots of 1024 tokens (the tools
#: part of Qwen3.5's system prompt alone is some 280 tokens).
config = partial(engine_config, max_inflight=2, ctx_size=1024, threads=1)

IDS = {text: token for token, text in ADDED_TOKENS.items()}
THINK_OPEN, THINK_CLOSE = IDS["<think>"], IDS["</think>"]
CALL_OPEN, CALL_CLOSE = IDS["<tool_call>"], IDS["</tool_call>"]
IM_END, ENDOFTEXT = IDS["<|im_end|>"], IDS["<|endoftext|>"]

WEATHER = Tool(
    "get_weather",
    "The weather forecast for a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
)


@pytest.fixture(scope="module")
def model(qwen35_real_path: Path) -> Iterator[LlamaModel]:
    model = LlamaModel(qwen35_real_path, slots=1, ctx_size=256, threads=1, n_batch=64)
    yield model
    model.close()


def template() -> ChatTemplate:
    return ChatTemplate(
        QWEN35_TEMPLATE.read_text(),
        architecture="qwen35",
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        render_builtin=None,
    )


def split(events: list[Token]) -> tuple[str, str]:
    """A reply's (reasoning, answer) texts."""
    reasoning = "".join(e.text for e in events if e.reasoning)
    return reasoning, "".join(e.text for e in events if not e.reasoning)


# -- the GGUF: vocabulary, added tokens, end of generation, template -----------------------


def test_the_model_carries_qwens_vocabulary_template_and_architecture(model: LlamaModel) -> None:
    assert model.architecture == "qwen35" and model.is_hybrid
    assert model.n_vocab == 151_936
    assert model.chat_template == QWEN35_TEMPLATE.read_text()
    assert model.eos == IM_END and not model.add_bos


def test_tokenization_matches_the_reference_of_the_vocabulary_file(model: LlamaModel) -> None:
    """llama.cpp's own reference for this vocabulary (``.inp`` texts, ``.out`` token ids from
    Qwen's Hugging Face tokenizer): the qwen35 pre-tokenizer splits as Qwen's does."""
    texts = QWEN35_VOCAB.with_suffix(".gguf.inp").read_text().split("\n__ggml_vocab_test__\n")
    expected = QWEN35_VOCAB.with_suffix(".gguf.out").read_text().split("\n")
    assert len(texts) >= 40 and len(expected) >= len(texts)
    for text, ids in zip(texts, expected, strict=False):
        want = [int(t) for t in ids.split()]
        assert model.tokenize(text, add_special=False, parse_special=False) == want, repr(text)


def test_each_added_token_is_one_token(model: LlamaModel) -> None:
    for token, text in ADDED_TOKENS.items():
        assert model.tokenize(text, add_special=False) == [token], text
        assert model.special_piece(token) == text.encode()
    # The chat markers (USER_DEFINED, as llama.cpp's converter writes Qwen's) are one token
    # even in text that is not parsed for special tokens, and render as text; the <|...|>
    # control tokens are spelled out in such text and render as nothing.
    for text in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert model.tokenize(text, add_special=False, parse_special=False) == [IDS[text]]
        assert model.piece(IDS[text]) == text.encode()
    assert len(model.tokenize("<|im_end|>", add_special=False, parse_special=False)) > 1
    assert model.piece(IM_END) == b""
    # A templated prompt: every marker in it is its own token.
    rendered = template().render([ChatMessage("user", "Hi")], think=None).text
    tokens = model.tokenize(rendered, add_special=False)
    assert tokens[:1] == [IDS["<|im_start|>"]] and tokens[-2:] == [THINK_OPEN, 198]
    assert tokens.count(IM_END) == 1


def test_the_end_of_generation_tokens_are_qwens(model: LlamaModel) -> None:
    """``<|im_end|>`` (the GGUF's eos) and ``<|endoftext|>`` end a generation; llama.cpp adds
    the FIM tokens Qwen has (pad, repo name, file separator) and, by its text, the ordinary
    BPE token ``</s>`` (128247, made a control token with a warning in the load log)."""
    assert model.eog == {
        IM_END,
        ENDOFTEXT,
        IDS["<|fim_pad|>"],
        IDS["<|repo_name|>"],
        IDS["<|file_sep|>"],
        128_247,
    }
    assert model.special_piece(128_247) == b"</s>"


def test_the_template_opens_a_think_block_unless_thinking_is_off() -> None:
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    on = template().render(messages, think=None)
    off = template().render(messages, think=False)
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert on.text == head + "<|im_start|>assistant\n<think>\n" and on.opens_think
    assert off.text == head + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert not off.opens_think


def test_a_tool_round_trip_renders_as_qwen_writes_it() -> None:
    """A call in the history, its result, and the turn after: the call in the XML form in a
    closed think block (the turn after the last user message keeps one), the result as a user
    turn in ``<tool_response>`` tags, and a new think block opened."""
    call = ToolCall("call_1", "get_weather", json.dumps({"city": "Paris", "days": 2}))
    messages = [
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "Sunny", tool_call_id="call_1"),
    ]
    text = template().render(messages, think=None, tools=(WEATHER,)).text
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following")
    listed = text[text.index("<tools>\n") + 8 : text.index("\n</tools>")]
    assert json.loads(listed) == WEATHER.as_openai()
    assert text[text.index("</IMPORTANT>") :] == (
        "</IMPORTANT><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nSunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


# -- generation through the engine ----------------------------------------------------------


async def test_the_engine_templates_with_the_ggufs_template(qwen35_real_path: Path) -> None:
    messages = [ChatMessage("user", "Hi")]
    async with Engine.open(config(qwen35_real_path)) as engine:
        for think in (None, False):
            request = GenerateRequest(messages=messages, think=think, max_tokens=1)
            _, done = await events_of(engine, request)
            rendered = template().render(messages, think=think).text
            assert done.prompt_tokens == len(engine.tokenize(rendered))
        _, done = await events_of(
            engine, GenerateRequest(messages=messages, tools=(WEATHER,), max_tokens=1)
        )
        with_tools = template().render(messages, think=None, tools=(WEATHER,)).text
        assert "<tools>\n" in with_tools and "<function=example_function_name>" in with_tools
        assert done.prompt_tokens == len(engine.tokenize(with_tools))
        # A tool round trip in the history (test_a_tool_round_trip_renders_as_qwen_writes_it).
        call = ToolCall("call_1", "get_weather", json.dumps({"city": "Paris", "days": 2}))
        history = [
            *messages,
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", "Sunny", tool_call_id="call_1"),
        ]
        request = GenerateRequest(messages=history, tools=(WEATHER,), max_tokens=1)
        _, done = await events_of(engine, request)
        rendered = template().render(history, think=None, tools=(WEATHER,)).text
        assert done.prompt_tokens == len(engine.tokenize(rendered))


async def test_generation_stops_at_either_end_of_generation_token(qwen35_real_path: Path) -> None:
    """A bias makes the model's first choice an end-of-generation token: the generation ends
    there, with no text and no completion token counted (the end token is neither output nor
    counted); with ``ignore_eos`` the same request runs to ``max_tokens``."""
    async with Engine.open(config(qwen35_real_path)) as engine:
        for eog in (IM_END, ENDOFTEXT):
            bias = ((eog, 100.0),)
            request = GenerateRequest.user("Hi", max_tokens=8, logit_bias=bias)
            text, done, _ = await run(engine, request)
            assert (text, done.stop, done.completion_tokens) == (
                "",
                StopReason.END_OF_GENERATION,
                0,
            )
            through = GenerateRequest.user("Hi", max_tokens=8, logit_bias=bias, ignore_eos=True)
            _, done, _ = await run(engine, through)
            assert (done.stop, done.completion_tokens) == (StopReason.MAX_TOKENS, 8)


async def test_reasoning_is_split_from_the_answer(qwen35_real_path: Path) -> None:
    """The template opens ``<think>``; a grammar makes the model write some reasoning, the
    ``</think>`` token (a bias makes it take the one token where the grammar allows it) and
    an answer: the reasoning comes out marked, the answer not, the tags dropped. (The
    reasoning ends in a letter: no token joins letters to ``<`` as ``.</`` does.)"""
    grammar = 'root ::= "I think so" "</think>" "\\n\\n" "Hello!"'
    request = GenerateRequest.user(
        "Hi", max_tokens=40, grammar=grammar, logit_bias=((THINK_CLOSE, 30.0),), logprobs=0
    )
    async with Engine.open(config(qwen35_real_path)) as engine:
        tokens, done = await events_of(engine, request)
        # Thinking off: the prompt closed the block, all of the reply is answer.
        off = GenerateRequest.user("Hi", think=False, max_tokens=20, grammar='root ::= "Hello!"')
        off_tokens, _ = await events_of(engine, off)
    assert split(tokens) == ("I think so", "Hello!")
    assert done.stop is StopReason.END_OF_GENERATION
    assert "</think>" in [lp.token for t in tokens for lp in t.logprobs]
    assert split(off_tokens) == ("", "Hello!")


@pytest.mark.parametrize("bias", [0.0, 30.0])
async def test_a_forced_call_takes_qwens_xml_form_and_parses(
    qwen35_real_path: Path, bias: float
) -> None:
    """``tool_choice="required"``: the reply is one call in the template's XML form, which the
    parser reads back into the tool's name and JSON arguments that follow its schema, whole
    or streamed; then the generation ends. With the bias, the tags are the single
    ``<tool_call>`` / ``</tool_call>`` tokens. Thinking off, as the chat API asks for a
    forced call (the call's grammar starts at the first token, which would be inside an open
    think block)."""
    request = GenerateRequest.user(
        "What is the weather in Paris?",
        tools=(WEATHER,),
        tool_choice="required",
        think=False,
        max_tokens=120,
        logit_bias=((CALL_OPEN, bias), (CALL_CLOSE, bias)),
        logprobs=0,
    )
    async with Engine.open(config(qwen35_real_path)) as engine:
        tokens, done = await events_of(engine, request)
    reasoning, text = split(tokens)
    assert reasoning == "" and done.stop is StopReason.END_OF_GENERATION, text
    assert text.startswith("<tool_call>\n<function=get_weather>\n<parameter=")
    assert text.endswith("</function>\n</tool_call>")
    if bias:
        pieces = [lp.token for t in tokens for lp in t.logprobs]
        assert pieces[0] == "<tool_call>" and pieces[-1] == "</tool_call>"
    parser = ToolCallParser((WEATHER,))
    items = parser.feed(text) + parser.flush()
    [call] = [i for i in items if isinstance(i, ToolCall)]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER.parameters)
    # Streamed piece by piece (as the engine's tokens came), the same call.
    stream = ToolCallStream((WEATHER,))
    events = [e for t in tokens if not t.reasoning for e in stream.feed(t.text)]
    events += stream.finish()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [s.name for s in starts] == ["get_weather"]
    streamed = "".join(e.text for e in events if isinstance(e, ToolCallArguments))
    assert json.loads(streamed) == json.loads(call.arguments)
    assert [e.complete for e in events if isinstance(e, ToolCallEnd)] == [True]


async def test_a_gguf_with_control_markers_keeps_their_text(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A GGUF that marks ``<think>`` and ``<tool_call>`` control tokens (whose text llama.cpp
    renders only when asked): the engine still outputs the tags where the model wrote them as
    one token, so the forced call and the reasoning are found."""
    path = write_qwen35_real(
        tmp_path_factory.mktemp("qwen35-control") / "qwen35-control.gguf",
        markers=gguf.TokenType.CONTROL,
    )
    forced = GenerateRequest.user(
        "What is the weather in Paris?",
        tools=(WEATHER,),
        tool_choice="required",
        think=False,
        max_tokens=120,
        logit_bias=((CALL_OPEN, 30.0), (CALL_CLOSE, 30.0)),
    )
    grammar = 'root ::= "Hm" "</think>" "\\n\\n" "Yes."'
    thinking = GenerateRequest.user(
        "Hi", max_tokens=30, grammar=grammar, logit_bias=((THINK_CLOSE, 30.0),)
    )
    try:
        async with Engine.open(config(path)) as engine:
            assert len(engine.tokenize("<tool_call>")) == 1
            tokens, _ = await events_of(engine, forced)
            thought, _ = await events_of(engine, thinking)
    finally:
        path.unlink()  # 167 MB
    parser = ToolCallParser((WEATHER,))
    _, text = split(tokens)
    [call] = [i for i in parser.feed(text) + parser.flush() if isinstance(i, ToolCall)]
    assert call.name == "get_weather"
    assert split(thought) == ("Hm", "Yes.")


# -- through the OpenAI API, with the openai client ---------------------------------------

WEATHER_JSON = {
    "type": "function",
    "function": {
        "name": WEATHER.name,
        "description": WEATHER.description,
        "parameters": WEATHER.parameters,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(qwen35_real_path: Path) -> Iterator[LiveServer]:
    server = start_server(
        config(qwen35_real_path),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=4), graceful_timeout=2),
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def model_id(server: LiveServer) -> str:
    return str(httpx.get(server.url + "/v1/models").json()["data"][0]["id"])


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_forced_call_through_the_api(
    client: openai.OpenAI, model_id: str, tool_choice: object
) -> None:
    reply = client.chat.completions.create(
        model=model_id,
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER_JSON],  # type: ignore[list-item]
        tool_choice=tool_choice,  # type: ignore[arg-type]
        max_tokens=120,
    )
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    assert getattr(choice.message, "reasoning_content", None) is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER.parameters)  # type: ignore[union-attr]


def test_a_forced_call_streamed_through_the_api(client: openai.OpenAI, model_id: str) -> None:
    stream = client.chat.completions.create(
        model=model_id,
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER_JSON],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=120,
        stream=True,
    )
    names, arguments, finish, content = [], [], [], []
    for chunk in stream:
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0
                if delta.function and delta.function.name:
                    names.append(delta.function.name)
                if delta.function and delta.function.arguments:
                    arguments.append(delta.function.arguments)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert names == ["get_weather"] and finish == ["tool_calls"] and "".join(content) == ""
    assert len(arguments) > 1  # streamed as generated, not in one piece at the end
    jsonschema.validate(json.loads("".join(arguments)), WEATHER.parameters)


def test_reasoning_and_answer_through_the_api(client: openai.OpenAI, model_id: str) -> None:
    """Thinking on (the template's default): the prompt opens ``<think>``, so the random
    model's words are reasoning, none of them the answer; off, all of them are the answer."""
    on = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=6)  # type: ignore[arg-type]
    off = client.chat.completions.create(
        model=model_id,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=6,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert on.usage is not None and off.usage is not None
    # The prompts differ in their ends only: "<think>", "\n" and "<think>", "\n\n",
    # "</think>", "\n\n".
    assert off.usage.prompt_tokens == on.usage.prompt_tokens + 2
    assert on.choices[0].finish_reason == off.choices[0].finish_reason == "length"
    assert getattr(on.choices[0].message, "reasoning_content", "")
    assert not on.choices[0].message.content
    assert off.choices[0].message.content
    assert getattr(off.choices[0].message, "reasoning_content", None) is None


@pytest.mark.parametrize("eog", [IM_END, ENDOFTEXT])
def test_the_api_stops_at_the_end_of_generation_tokens(
    client: openai.OpenAI, model_id: str, eog: int
) -> None:
    reply = client.chat.completions.create(
        model=model_id,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=8,
        logit_bias={str(eog): 100},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == ""
    assert reply.usage is not None and reply.usage.completion_tokens == 0
