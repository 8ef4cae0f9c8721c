"""What an agent run shows outside the database: its output and transcript as Markdown, and text for terminals.

Model output, tool arguments and errors are untrusted (a prompt-injected model writes whatever it
was told to), and may hold the requester's secrets (a webhook URL with its token, a header value).
Everything shown here passes through ``redact.redact_value`` (structures: header and secret-like
values hidden) and ``redact.shown_text`` (URLs cut to their host, credential echoes hidden, control
characters written visibly); Markdown puts untrusted text only inside fenced code blocks (see
``code_block``). The stored transcript stays as it was: the engine and an audit read it whole.
Dagster-free, so the command line can use it without importing Dagster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from marketing_pipelines.redact import redact_value, shown_text

OUTPUT_CHARS = 8_000
# What starts every line of a model's output on a terminal (``agents show``): no field or section line starts so.
OUTPUT_MARGIN = "    | "
LINE_CHARS = 240
TRANSCRIPT_LINES = 100

_BACKTICKS = re.compile(r"`+")
_WHITESPACE = re.compile(r"\s+")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(value: Any) -> str:
    value = redact_value(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return _cut(_WHITESPACE.sub(" ", shown_text(text)).strip(), LINE_CHARS)


def code_block(text: str) -> str:
    """``text`` in a fenced code block that nothing inside it can close.

    A fenced code block is the one Markdown construct whose content the renderer never parses: no
    links, images, autolinks or raw HTML, whichever extensions the Dagster UI's renderer enables.
    Escaping Markdown characters instead would be a deny-list over a grammar (CommonMark, GFM
    autolinks, HTML) that a renderer may extend. The fence is longer than any run of backticks in
    the text, so the text cannot end the block early.
    """
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def output_markdown(text: str, agent_run_id: int) -> str:
    """An agent run's output for the Dagster UI: the model's text verbatim (not rendered), cut to a sane size."""
    shown = shown_text(text)
    if not shown.strip():
        return "*(the agent gave no text)*"
    block = code_block(_cut(shown, OUTPUT_CHARS))
    if len(shown) > OUTPUT_CHARS:
        block += f"\n\nCut at {OUTPUT_CHARS} characters; all of it: `marketing-pipelines agents show {agent_run_id}`."
    return block


def output_lines(text: str) -> list[str]:
    """A model's output for a terminal, one entry per line, each behind ``OUTPUT_MARGIN``.

    ``shown_text`` leaves newline as the only line break (``\\r``, U+2028, U+0085 and the rest are written as
    escapes), and every line of the text, the first included, starts with the margin: whatever the model
    wrote, no line of it can pass for a field (``error: ...``) or a section (``transcript:``) around it.
    """
    return [f"{OUTPUT_MARGIN}{line}" for line in shown_text(text).split("\n")]


def transcript_lines(steps: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per model turn and per tool call (with its outcome); refused calls start with ``refused:``."""
    lines: list[str] = []
    calls: dict[str, int] = {}  # tool call id -> index of its line, to add the outcome to it
    turns = 0
    for step in steps:
        kind, name, content = step["kind"], step["name"] or "", step["content"]
        content = content if isinstance(content, dict) else {"value": content}
        if kind == "model_turn":
            turns += 1
            text = _one_line(content.get("text") or "") or "(no text)"
            asked = len(content.get("tool_calls") or [])
            asks = f" [{asked} tool call(s)]" if asked else ""
            lines.append(f"model turn {turns} ({_one_line(name)}): {text}{asks}")
        elif kind == "tool_call":
            calls[str(content.get("id"))] = len(lines)
            lines.append(f"tool call {_one_line(name)} {_one_line(content.get('arguments', {}))}")
        elif kind in ("tool_result", "denial", "tool_error"):
            index = calls.get(str(content.get("id")))
            call = lines[index] if index is not None else f"tool call {_one_line(name)}"
            if kind == "tool_result":
                line = f"{call} -> ok"
            elif kind == "denial":
                line = f"refused: {call} -> {_one_line(content.get('reason', ''))}"
            else:
                line = f"{call} -> error: {_one_line(content.get('error', ''))}"
            if index is None:
                lines.append(line)
            else:
                lines[index] = line
        elif kind == "error":
            lines.append(f"error: {_one_line(content.get('error', content))}")
        # "task" is the run's own input, already in the run's config and tags.
    return [_cut(line, LINE_CHARS * 2) for line in lines]


def transcript_markdown(steps: Iterable[Mapping[str, Any]], agent_run_id: int, attempt: int) -> str:
    """This attempt's transcript for the Dagster UI: counts, then one line per model turn and tool call."""
    lines = transcript_lines(steps)
    turns = sum(line.startswith("model turn ") for line in lines)
    calls = sum(line.startswith(("tool call ", "refused: ")) for line in lines)
    refused = sum(line.startswith("refused: ") for line in lines)
    head = f"Attempt {attempt}: {turns} model turn(s), {calls} tool call(s), {refused} refused."
    if not lines:
        return head
    shown = lines[:TRANSCRIPT_LINES]
    text = f"{head}\n\n{code_block(chr(10).join(shown))}"
    if len(lines) > TRANSCRIPT_LINES:
        text += (
            f"\n\n{len(lines) - TRANSCRIPT_LINES} more line(s); the whole transcript: "
            f"`marketing-pipelines agents show {agent_run_id}`."
        )
    return text
