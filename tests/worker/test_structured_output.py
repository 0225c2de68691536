"""Structured output end to end through the official ``openai`` client: pydantic models with
bounds, patterns, lengths, formats, literals, optionals, nested models and lists, in a batch
mixed with free requests; every structured reply stops on its own and validates."""

from __future__ import annotations

import datetime
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any, Literal

import pydantic
from openai.lib._pydantic import to_strict_json_schema

from .._schemas import validator
from .._server import LiveServer
from ..stack.test_serve import client


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(min_length=1, max_length=16)
    zip: str = pydantic.Field(pattern=r"^[0-9]{5}$")


class Profile(pydantic.BaseModel):
    name: str = pydantic.Field(min_length=1, max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    score: float = pydantic.Field(gt=0, le=10, multiple_of=0.5)
    role: Literal["admin", "user", "guest"]
    nickname: str | None = pydantic.Field(max_length=8)
    joined: datetime.date
    id: uuid.UUID
    tags: list[Literal["new", "vip", "staff"]] = pydantic.Field(max_length=3)
    address: Address


PROMPTS = [
    "Describe a user profile as JSON.",
    "The customer Bob, 42, from Paris:",
    "A staff member's record, please.",
]
# Every value is bounded, so a reply fits (whitespace is bounded per gap too).
MAX_TOKENS = 420


def test_pydantic_models_in_a_batch_with_free_requests(live_server: LiveServer) -> None:
    api = client(live_server)
    schema = to_strict_json_schema(Profile)

    def structured(i: int) -> Any:
        return api.chat.completions.parse(
            model="any",
            messages=[{"role": "user", "content": PROMPTS[i]}],
            response_format=Profile,
            max_tokens=MAX_TOKENS,
            temperature=0,  # greedy: a token the grammar refuses costs a 64-token check
        )

    def free(i: int) -> Any:
        return api.chat.completions.create(
            model="any", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=24
        )

    # The live server's four slots: three structured replies and a free one decode together.
    with ThreadPoolExecutor(4) as pool:
        parsed = [pool.submit(structured, i) for i in range(3)]
        plain = [pool.submit(free, i) for i in range(1)]
        replies = [f.result() for f in parsed]
        frees = [f.result() for f in plain]
    for reply in replies:
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content  # it ended on its own
        assert isinstance(choice.message.parsed, Profile)
        value = json.loads(choice.message.content or "", parse_float=Decimal)
        assert not list(validator(schema).iter_errors(value)), value
    for reply in frees:
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.choices[0].message.content
