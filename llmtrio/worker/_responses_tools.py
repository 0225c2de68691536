"""The Responses API's tools (``tools``, ``tool_choice``, ``parallel_tool_calls``): which tools
the model is offered, under which names, and how its calls are named back. Pure.

- ``function`` tools are offered as they are;
- ``custom`` tools take text, not JSON: free (``format`` absent or ``{"type": "text"}``) or
  held to a grammar (``{"type": "grammar", "syntax": "lark" | "regex", "definition"}``), the
  engine's text tools (:class:`TextFormat`); a grammar the engine cannot translate leaves the
  text free, with a warning, and the request is answered (a custom tool is never strict);
- ``namespace`` tools (Codex's sub-agent tools, MCP servers' tools) are flattened: each of
  their ``function`` and ``custom`` tools is offered as ``namespace.name``
  (:func:`flat_name`), and its calls come back with ``name`` and ``namespace`` apart, as
  OpenAI's do;
- tools of other types (``web_search``, ``file_search``, ...) are left out of what the model
  is offered, with a warning: clients such as Codex send them with every request.

Every refusal is an :class:`ApiError` (400) naming the field.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from ..api import (
    RESPONSES_CUSTOM_TOOL,
    RESPONSES_NAMESPACE_TOOL,
    RESPONSES_TOOL,
    Body,
    RequestLimits,
    check,
    invalid_type,
    invalid_value,
    missing,
    read,
    show,
)
from ..engine import TextFormat, Tool
from ._features import ToolChoice, choose_tools

__all__ = ["OfferedTool", "ResponsesTools", "flat_name", "parse_responses_tools"]

logger = logging.getLogger("llmtrio.worker")

#: Between a namespace's name and its tool's in the name the model sees.
NAMESPACE_SEPARATOR = "."


def flat_name(name: str, namespace: str | None) -> str:
    """The name the model sees for tool ``name`` of ``namespace`` (none: its own name)."""
    return name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{name}"


@attrs.frozen
class OfferedTool:
    """A tool as the client named it: its ``name``, its ``namespace`` (``None``: a top-level
    tool) and whether it is a ``custom`` tool (its calls are ``custom_tool_call`` items)."""

    name: str
    namespace: str | None = None
    custom: bool = False


@attrs.frozen
class ResponsesTools:
    """The tools of one request: ``choice`` (the tools the model sees, by their flat names,
    and how it must use them), ``offered`` (each flat name's tool as the client named it),
    ``echo`` (the tools as the response repeats them) and ``choice_echo`` (its
    ``tool_choice``)."""

    choice: ToolChoice
    offered: dict[str, OfferedTool]
    echo: list[dict[str, Any]]
    choice_echo: Any


def parse_responses_tools(data: dict[str, Any], limits: RequestLimits) -> ResponsesTools:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` (see the module's doc).

    Error handling: :class:`ApiError` (400) naming the field: a tool of a known type with a
    bad shape, a name used twice, a ``tool_choice`` naming no offered tool."""
    tools: list[Tool] = []
    offered: dict[str, OfferedTool] = {}
    echo: list[dict[str, Any]] = []
    skipped: list[str] = []
    for i, item in enumerate(read(data, Body.RESPONSES, "tools", limits) or ()):
        where = f"tools[{i}]"
        kind = _kind(item, where)
        if kind == "namespace":
            space = check(RESPONSES_NAMESPACE_TOOL, item, limits, where)
            inner: list[dict[str, Any]] = []
            for j, member in enumerate(space["tools"]):
                at = f"{where}.tools[{j}]"
                member_kind = _kind(member, at)
                if member_kind not in ("function", "custom"):
                    skipped.append(f"{member_kind} (in namespace {space['name']})")
                    continue
                tool, shown = _tool(member, member_kind, at, limits)
                named = OfferedTool(tool.name, space["name"], tool.text is not None)
                _add(tools, offered, tool, named)
                inner.append(shown)
            echo.append({"type": "namespace", "name": space["name"],
                         "description": space.get("description"), "tools": inner})  # fmt: skip
        elif kind in ("function", "custom"):
            tool, shown = _tool(item, kind, where, limits)
            _add(tools, offered, tool, OfferedTool(tool.name, None, tool.text is not None))
            echo.append(shown)
        else:
            skipped.append(kind)
    if skipped:
        logger.warning(
            "responses: left out tools this server cannot run: %s", ", ".join(sorted(set(skipped)))
        )
    models_tools = [attrs.evolve(t, name=name) for name, t in zip(offered, tools, strict=True)]
    parallel = read(data, Body.RESPONSES, "parallel_tool_calls", limits) is not False
    choice = data.get("tool_choice")
    return ResponsesTools(
        _choose(models_tools, choice, parallel),
        offered,
        echo,
        choice if choice is not None else "auto",
    )


def _kind(item: object, where: str) -> str:
    if not isinstance(item, dict):
        raise invalid_type(where, "an object", item)
    kind = item.get("type")
    if kind is None:
        raise missing(f"{where}.type")
    if not isinstance(kind, str):
        raise invalid_type(f"{where}.type", "a string", kind)
    return kind


def _tool(
    item: dict[str, Any], kind: str, where: str, limits: RequestLimits
) -> tuple[Tool, dict[str, Any]]:
    """A ``function`` or ``custom`` tool as the engine's :class:`Tool` (by its own name) and
    as the response echoes it."""
    description = item.get("description") or ""
    if kind == "function":
        check(RESPONSES_TOOL, item, limits, where)
        parameters = item.get("parameters") or {"type": "object", "properties": {}}
        tool = Tool(item["name"], description, parameters, strict=item.get("strict") is True)
        return tool, {"type": "function", "name": item["name"],
                      "description": item.get("description"), "parameters": parameters,
                      "strict": item.get("strict")}  # fmt: skip
    check(RESPONSES_CUSTOM_TOOL, item, limits, where)
    shape = item.get("format") or {"type": "text"}
    if shape["type"] == "text":
        text = TextFormat()
    else:
        for name in ("syntax", "definition"):
            if shape.get(name) is None:
                raise missing(f"{where}.format.{name}", " (a 'grammar' format has both)")
        text = TextFormat(shape["syntax"], shape["definition"])
    return Tool(item["name"], description, text=text), {
        "type": "custom",
        "name": item["name"],
        "description": item.get("description"),
        "format": shape,
    }


def _add(
    tools: list[Tool], offered: dict[str, OfferedTool], tool: Tool, named: OfferedTool
) -> None:
    name = flat_name(named.name, named.namespace)
    if name in offered:
        raise invalid_value("tools", f"the name {show(name)} is used twice.")
    tools.append(tool)
    offered[name] = named


def _choose(tools: list[Tool], choice: object, parallel: bool) -> ToolChoice:
    """``tool_choice``: ``none``, ``auto``, ``required``, or the tool the reply must call
    (``{"type": "function" | "custom", "name"}``; a namespace's function by its flat name, or
    by its name with ``namespace``)."""
    if choice is None:
        return choose_tools(tools, "auto", parallel=parallel)
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise invalid_value(
                "tool_choice",
                f"{show(choice)}. Supported values are: 'none', 'auto', 'required' or a "
                "named tool.",
            )
        return choose_tools(tools, choice, parallel=parallel)
    if not isinstance(choice, dict):
        raise invalid_type("tool_choice", "a string or an object", choice)
    kind = choice.get("type")
    if kind not in ("function", "custom"):
        raise invalid_value(
            "tool_choice",
            f"this server cannot run {show(kind)} tools; it runs 'function' and 'custom' tools.",
        )
    name = choice.get("name")
    if not isinstance(name, str):
        raise invalid_type("tool_choice.name", "a string", name)
    namespace = choice.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise invalid_type("tool_choice.namespace", "a string", namespace)
    return choose_tools(tools, "required", name=flat_name(name, namespace), parallel=parallel)
