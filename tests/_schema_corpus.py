"""The corpus of real schemas the tool-schema tests compile (tests/engine/test_tool_schemas.py):

- the cases of llama.cpp's own ``tests/test-json-schema-to-grammar.cpp``, kept in
  ``tests/data/llama-json-schema-cases.json`` (refreshed from a llama-cpp-python sdist with
  ``python -m tests._schema_corpus <sdist folder>``);
- every tool the captured clients send (``tests/data/clients/``): Claude Code's, Codex's
  (function tools, the tools of its ``namespace`` tools, and its ``custom`` text tools) and
  each MCP server's.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import attrs

from llmtrio.engine import TextFormat, Tool

__all__ = ["CLIENTS", "LLAMA_CASES", "CorpusTool", "client_tools", "llama_cases"]

DATA = Path(__file__).resolve().parent / "data"
LLAMA_CASES = DATA / "llama-json-schema-cases.json"
CLIENTS = DATA / "clients"

_CASE = re.compile(r'test\(\{\s*(SUCCESS|FAILURE),\s*"((?:[^"\\]|\\.)*)",\s*R"""\((.*?)\)"""', re.S)
_PARSED = re.compile(r'common_json::parse\(R"""\((.*?)\)"""\)', re.S)


def extract_llama_cases(source: str) -> list[dict[str, Any]]:
    """The schemas of ``test-json-schema-to-grammar.cpp``: each ``test({...})`` case (its
    name, whether llama.cpp's converter takes it, the schema) and the documents its main
    parses directly."""
    cases = [
        {"name": name, "llama_cpp": status.lower(), "schema": json.loads(schema)}
        for status, name, schema in _CASE.findall(source)
    ]
    for i, schema in enumerate(_PARSED.findall(source)):
        cases.append(
            {"name": f"main document {i + 1}", "llama_cpp": "success", "schema": json.loads(schema)}
        )
    return cases


def llama_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(LLAMA_CASES.read_text())["cases"]
    return cases


@attrs.frozen
class CorpusTool:
    """One tool a client sends: where from (``source``: the fixture's file name) and the
    tool as the engine takes it."""

    source: str
    tool: Tool

    @property
    def id(self) -> str:
        return f"{self.source.split('.')[0]}:{self.tool.name}"


def _responses_tools(items: list[dict[str, Any]], source: str) -> list[CorpusTool]:
    out = []
    for item in items:
        kind = item.get("type")
        if kind == "function":
            out.append(CorpusTool(source, Tool(item["name"], "", item.get("parameters") or {})))
        elif kind == "namespace":
            out += _responses_tools(item.get("tools", []), source)
        elif kind == "custom":
            fmt = item.get("format") or {}
            text = TextFormat(fmt.get("syntax"), fmt.get("definition", ""))
            if fmt.get("type") != "grammar":
                text = TextFormat()
            out.append(CorpusTool(source, Tool(item["name"], "", text=text)))
    return out


def client_tools() -> list[CorpusTool]:
    """Every tool of every captured client request and MCP tool list (a tool a client sends
    in several captures, the same schema, once)."""
    tools: list[CorpusTool] = []
    seen: set[str] = set()

    def add(found: list[CorpusTool]) -> None:
        for one in found:
            key = json.dumps([one.tool.name, one.tool.parameters, attrs.asdict(one.tool)])
            if key not in seen:
                seen.add(key)
                tools.append(one)

    for path in sorted(CLIENTS.glob("*.json")):
        document = json.loads(path.read_text())
        for request in document["requests"]:
            body = request["body"]
            if not isinstance(body, dict):
                continue
            if request["path"].startswith("/v1/messages"):
                add(
                    [
                        CorpusTool(path.name, Tool(t["name"], "", t.get("input_schema") or {}))
                        for t in body.get("tools", [])
                        if t.get("type") in (None, "custom")
                    ]
                )
            elif request["path"].startswith("/v1/responses"):
                add(_responses_tools(body.get("tools", []), path.name))
    for path in sorted((CLIENTS / "mcp").glob("*.tools.json")):
        document = json.loads(path.read_text())
        add(
            [
                CorpusTool(path.name, Tool(t["name"], "", t.get("inputSchema") or {}))
                for t in document["tools"]
            ]
        )
    return tools


def main(sdist: str) -> None:
    source = Path(sdist) / "vendor" / "llama.cpp" / "tests" / "test-json-schema-to-grammar.cpp"
    cases = extract_llama_cases(source.read_text())
    document = {
        "source": "llama-cpp-python 0.3.36 sdist: "
        "vendor/llama.cpp/tests/test-json-schema-to-grammar.cpp",
        "refresh": "python -m tests._schema_corpus <the unpacked sdist's folder>",
        "cases": cases,
    }
    LLAMA_CASES.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {LLAMA_CASES}")


if __name__ == "__main__":
    main(sys.argv[1])
