"""OpenAI's Agents SDK (``openai-agents``) against a server, run by the SDK's own virtual
environment (``tests/_clients.py``'s ``AGENTS_SDK``): an agent whose model must call its one
function tool (``tool_choice`` names it), on the Responses API, whole and streamed. Prints
one JSON object: per mode, the tool's arguments, the final output and the usage.

    <venv>/bin/python tests/_drive_agents_sdk.py BASE_URL MODEL

It imports nothing of llmtrio (another interpreter runs it).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated, Any

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import Field

CALLS: list[dict[str, Any]] = []


@function_tool
def lookup(city: Annotated[str, Field(max_length=12)]) -> str:
    """The weather in a city."""
    CALLS.append({"city": city})
    return f"Sunny in {city}."


async def main(base_url: str, model: str) -> dict[str, Any]:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Look up the weather.",
        model=OpenAIResponsesModel(model=model, openai_client=client),
        tools=[lookup],
        model_settings=ModelSettings(tool_choice="lookup", max_tokens=200, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )
    out: dict[str, Any] = {}
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=2)
    out["whole"] = _summary(result)
    streamed = Runner.run_streamed(agent, "What is the weather in Oslo?", max_turns=2)
    kinds = [event.type async for event in streamed.stream_events()]
    out["streamed"] = {**_summary(streamed), "events": sorted(set(kinds))}
    await client.close()
    return out


def _summary(result: Any) -> dict[str, Any]:
    usage = result.context_wrapper.usage
    return {
        "calls": CALLS[-1:],
        "final_output": result.final_output,
        "usage": {
            "requests": usage.requests,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        },
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
