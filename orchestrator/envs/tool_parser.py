"""Tool calls in a model turn's text -> the OpenAI schema, for the agent endpoint (`envs.endpoint`).

Contract: `parse_tool_calls(name, text, call_id) -> (content, calls)`. `name` is a parser of
`PARSERS` (`hermes`: the format of Hermes, Qwen 2.5/3 and most chat templates with tools:
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call, the last one may be
unclosed when the turn was cut). `content` is the text before the first block, stripped (None when
empty); `calls` are OpenAI tool calls `{"id", "type": "function", "function": {"name",
"arguments"}}` with `arguments` a JSON string and ids `call_id(i)`. A block that is not a JSON
object with a string `name` makes the whole turn plain content (no calls): a malformed call is
text the agent sees, not an error. Parsing never changes the trajectory: the sampled ids are kept
as they are, and the assistant message the agent sends back is matched against what was returned
(`envs.agent_session`).
"""
from __future__ import annotations

import json
import re
from typing import Callable, Optional

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)


def hermes(text: str, call_id: Callable[[int], str]) -> tuple[Optional[str], list[dict]]:
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    calls = []
    for i, block in enumerate(_HERMES.findall(text[start:])):
        try:
            obj = json.loads(block.strip())
        except ValueError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append({"id": call_id(i), "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str)
                                   else json.dumps(args, ensure_ascii=False)}})
    content = text[:start].strip()
    return (content or None), calls


PARSERS = {"hermes": hermes}


def parse_tool_calls(name: str, text: str, call_id: Callable[[int], str]) -> tuple[Optional[str], list[dict]]:
    return PARSERS[name](text, call_id)
