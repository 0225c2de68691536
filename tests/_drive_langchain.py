"""LangChain's OpenAI integration (``langchain-openai``) against a server, run by its own
virtual environment (``tests/_clients.py``'s ``LANGCHAIN_OPENAI``): a chat reply, a forced
tool call, and structured output (a JSON schema), each with its usage. Prints one JSON
object.

    <venv>/bin/python tests/_drive_langchain.py BASE_URL MODEL

It imports nothing of llmtrio (another interpreter runs it).
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


@tool
def lookup(city: Annotated[str, Field(max_length=12)]) -> str:
    """The weather in a city."""
    return f"Sunny in {city}."


class Pick(BaseModel):
    """A colour and a number."""

    colour: str = Field(max_length=12)
    number: int = Field(ge=0, le=9)


def main(base_url: str, model: str) -> dict[str, Any]:
    def chat_model(max_tokens: int) -> ChatOpenAI:
        return ChatOpenAI(
            base_url=base_url, api_key="unused", model=model, max_tokens=max_tokens,
            temperature=0, max_retries=0,
        )  # fmt: skip

    chat, room = chat_model(24), chat_model(200)  # a call's markup takes room
    reply = chat.invoke("Say hi.")
    called = room.bind_tools([lookup], tool_choice="lookup").invoke("Weather in Paris?")
    structured = room.with_structured_output(Pick, method="json_schema", include_raw=True)
    picked = structured.invoke("Pick a colour and a number.")
    streamed = "".join(str(chunk.content) for chunk in chat.stream("Say hi."))
    return {
        "chat": {"text": reply.content, "usage": reply.usage_metadata},
        "tools": {"tool_calls": called.tool_calls, "usage": called.usage_metadata},
        "structured": {
            "parsed": picked["parsed"].model_dump() if picked["parsed"] else None,
            "error": repr(picked["parsing_error"]) if picked["parsing_error"] else None,
            "usage": picked["raw"].usage_metadata,
        },
        "streamed": streamed,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
