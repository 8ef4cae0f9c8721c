"""A fake Anthropic Messages API on loopback that enforces its rate limits and prompt caching as Anthropic documents.

``FakeAnthropic`` is a ``ThreadingHTTPServer`` on 127.0.0.1 (port 0) answering ``POST /v1/messages`` (``x-api-key``,
``anthropic-version``) with Messages shaped as the API's (``anthropic.types.Message``, ``Usage``) and errors shaped
``{"type": "error", "error": {"type", "message"}, "request_id"}``. It runs in the test's or benchmark's process; agent
runs in other processes reach it over HTTP, and ``GET /_fake/stats`` gives its counters to any process.

Rate limits (platform.claude.com "Rate limits", read 2026-12-07): requests, input tokens and output tokens per minute,
each a token bucket whose capacity is the per-minute limit, refilled continuously at limit/60 per second. At arrival a
request takes 1 request, its input counted as ``input_tokens + cache_creation_input_tokens`` (cache reads do not
count) and ``max_tokens`` of output ("OTPM rate limits are estimated based on max_tokens at the beginning of each
request, and the estimate is adjusted at the end"): the unused part of ``max_tokens`` is given back when it answers.
A request that any bucket cannot cover takes nothing and is answered 429 ``rate_limit_error`` with ``retry-after``
(whole seconds until it would fit). Every answer carries ``anthropic-ratelimit-{requests,input-tokens,output-tokens,
tokens}-{limit,remaining,reset}``: token counts remaining rounded to the nearest thousand as documented, reset as
the RFC 3339 time the bucket is full again. ``set_limits`` changes the limits mid-run (the next headers say so).

Tokens: deterministic, ``ceil(characters / 4)`` per block (a tool definition's JSON, a system text block, a message
content block), so a prefix's tokens are the sum of its blocks'.

Prompt caching (platform.claude.com "Prompt caching"): the prefix order is tools, system, messages; a block with
``cache_control: {"type": "ephemeral"}`` (at most 4) marks the prefix up to and including it, cached when it is at
least ``cache_min_tokens`` (1,024 on Claude Sonnet 4.5) for 5 minutes (``"ttl": "1h"``: an hour), refreshed on each
read. A request reads the longest cached prefix ending at a breakpoint or at one of the 20 blocks before it (the
documented look-back), and writes from there to its last cacheable breakpoint.

Answers are scripted: by default each conversation gets one ``tool_use`` turn per tool of the request whose required
arguments the task (the first user message, a JSON object) supplies, in the order offered, then an ``end_turn``
text; ``answer=`` replaces that with a function of the request body.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

API_KEY = "fake-anthropic-key"
ANTHROPIC_VERSION = "2023-06-01"
MAX_CACHE_BREAKPOINTS = 4
CACHE_LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
MAX_BODY_BYTES = 32 * 1024 * 1024  # the Messages API's request size limit (413 above it)
UNITS = ("requests", "input_tokens", "output_tokens")

Answer = Callable[[dict[str, Any]], dict[str, Any]]


def tokens_of(value: Any) -> int:
    """The fake's tokenizer: ceil(characters / 4) of a string or a text block's text, else of the block's JSON."""
    if isinstance(value, dict) and value.get("type") == "text" and isinstance(value.get("text"), str):
        value = value["text"]
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return math.ceil(len(text) / 4)


@dataclass(frozen=True)
class Limits:
    """Per minute, as Anthropic's tiers state them (Tier 1, Claude Sonnet 4.x: 50 / 30,000 / 8,000)."""

    requests: int = 50
    input_tokens: int = 30_000
    output_tokens: int = 8_000

    def of(self, unit: str) -> int:
        return int(getattr(self, unit))


class _Bucket:
    """One unit's token bucket: capacity = the per-minute limit, refilled at limit/60 a second, up to capacity."""

    def __init__(self, capacity: float, now: float) -> None:
        self.capacity, self.level, self.updated = float(capacity), float(capacity), now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + max(0.0, now - self.updated) * self.capacity / 60.0)
        self.updated = max(self.updated, now)

    def resize(self, capacity: float, now: float) -> None:
        self.refill(now)
        self.capacity = float(capacity)
        self.level = min(self.level, self.capacity)

    def seconds_until(self, amount: float) -> float:
        """Seconds until the bucket holds ``amount`` (inf when it never can: more than its capacity)."""
        if amount <= self.level:
            return 0.0
        if amount > self.capacity or self.capacity <= 0:
            return math.inf
        return (amount - self.level) * 60.0 / self.capacity

    def seconds_to_full(self) -> float:
        return 0.0 if self.capacity <= 0 else (self.capacity - self.level) * 60.0 / self.capacity


@dataclass(frozen=True)
class Block:
    """One block of the prompt's prefix order: its identity (what a cache key hashes), tokens and breakpoint."""

    identity: str
    tokens: int
    cache_ttl: str | None  # "5m" / "1h" when the block carries cache_control


@dataclass(frozen=True)
class CachePlan:
    """What a request would read from and write to the cache: computed first, committed only when admitted."""

    total_tokens: int
    read_tokens: int
    write_tokens: int
    write_1h_tokens: int
    reads: tuple[str, ...]  # keys whose TTL a read refreshes
    writes: tuple[tuple[str, float], ...]  # (key, ttl seconds)

    @property
    def uncached_tokens(self) -> int:
        return self.total_tokens - self.read_tokens - self.write_tokens

    @property
    def counted_input(self) -> int:
        """What the input-token limit counts: input_tokens + cache_creation_input_tokens (reads do not count)."""
        return self.total_tokens - self.read_tokens


@dataclass(frozen=True)
class Record:
    """One request as the fake saw it: when it was admitted (or refused: wall time), its HTTP status, the input
    counted against the limit and the usage answered."""

    at: float
    status: int
    counted_input: int
    usage: dict[str, int]


class RequestError(Exception):
    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


def _ttl_of(block: Any) -> str | None:
    control = block.get("cache_control") if isinstance(block, dict) else None
    if control is None:
        return None
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise RequestError(400, "invalid_request_error", "cache_control.type: Input should be 'ephemeral'")
    ttl = control.get("ttl", "5m")
    if ttl not in TTL_SECONDS:
        raise RequestError(400, "invalid_request_error", "cache_control.ttl: Input should be '5m' or '1h'")
    return ttl


def _without_cache_control(block: Any) -> Any:
    return {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, dict) else block


def prompt_blocks(body: dict[str, Any]) -> list[Block]:
    """The request's blocks in the cache's prefix order: tools, then system, then each message's content blocks."""
    blocks: list[Block] = []

    def add(kind: str, block: Any) -> None:
        bare = _without_cache_control(block)
        tokens = tokens_of(bare)
        blocks.append(Block(json.dumps([kind, bare], sort_keys=True), tokens, _ttl_of(block)))

    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestError(400, "invalid_request_error", "tools: Input should be a valid list of tools")
    for tool in tools:
        add("tool", tool)
    system = body.get("system")
    if isinstance(system, str):
        if system:
            add("system", system)
    elif isinstance(system, list):
        for block in system:
            if not isinstance(block, dict) or block.get("type") != "text":
                raise RequestError(400, "invalid_request_error", "system: blocks must be text blocks")
            add("system", block)
    elif system is not None:
        raise RequestError(400, "invalid_request_error", "system: Input should be a string or a list of blocks")
    for index, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise RequestError(
                400, "invalid_request_error", f"messages.{index}.role: Input should be user or assistant"
            )
        content = message.get("content")
        role = message["role"]
        if isinstance(content, str):
            add(role, content)
        elif isinstance(content, list) and all(isinstance(b, dict) for b in content):
            for block in content:
                add(role, block)
        else:
            raise RequestError(400, "invalid_request_error", f"messages.{index}.content: Input should be str or list")
    breakpoints = sum(1 for b in blocks if b.cache_ttl is not None)
    if breakpoints > MAX_CACHE_BREAKPOINTS:
        raise RequestError(
            400,
            "invalid_request_error",
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {breakpoints}.",
        )
    return blocks


def _validated(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(400, "invalid_request_error", "body: Input should be an object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise RequestError(400, "invalid_request_error", "model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise RequestError(400, "invalid_request_error", "max_tokens: Input should be a positive integer")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "invalid_request_error", "messages: at least one message is required")
    return body


def _task_of(body: dict[str, Any]) -> dict[str, Any]:
    first = body["messages"][0].get("content")
    text = first if isinstance(first, str) else ""
    if isinstance(first, list):
        text = "".join(b.get("text", "") for b in first if isinstance(b, dict) and b.get("type") == "text")
    try:
        task = json.loads(text)
    except ValueError:
        return {}
    return task if isinstance(task, dict) else {}


def scripted_answer(body: dict[str, Any]) -> dict[str, Any]:
    """One ``tool_use`` turn per tool the task can call (its required arguments all in the task), then end_turn."""
    task = _task_of(body)
    callable_tools = [
        tool
        for tool in body.get("tools") or []
        if all(name in task for name in (tool.get("input_schema") or {}).get("required", []))
    ]
    turns_made = sum(
        1
        for message in body["messages"]
        if message.get("role") == "assistant"
        and isinstance(message.get("content"), list)
        and any(b.get("type") == "tool_use" for b in message["content"] if isinstance(b, dict))
    )
    if turns_made < len(callable_tools):
        tool = callable_tools[turns_made]
        properties = (tool.get("input_schema") or {}).get("properties", {})
        arguments = {k: task[k] for k in properties if k in task}
        return {
            "content": [
                {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": tool["name"], "input": arguments}
            ],
            "stop_reason": "tool_use",
        }
    summary = f"Read {turns_made} tool result(s) for campaign {task.get('campaign_id', '?')}: all stages on track."
    return {"content": [{"type": "text", "text": summary}], "stop_reason": "end_turn"}


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(math.ceil(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _nearest_thousand(value: float) -> int:
    return math.floor(max(0.0, value) / 1000.0 + 0.5) * 1000


@dataclass
class FakeAnthropic:
    """The server and its state. ``clock`` drives the buckets and the cache (a test may freeze it); ``wall`` stamps
    the counters and the reset headers. ``latency_s`` is how long each admitted request takes to answer."""

    limits: Limits = field(default_factory=Limits)
    answer: Answer = scripted_answer
    latency_s: float = 0.0
    cache_min_tokens: int = 1024
    api_key: str = API_KEY
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        now = self.clock()
        self._buckets = {unit: _Bucket(self.limits.of(unit), now) for unit in UNITS}
        self._cache: dict[str, float] = {}  # prefix key -> expiry (clock time)
        self._records: list[Record] = []
        self._queued_errors: list[tuple[int, str, str, dict[str, str]]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- controls -------------------------------------------------------------------------------

    def set_limits(
        self, *, requests: int | None = None, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> None:
        """New per-minute limits from now on; a bucket holding more than its new capacity is cut to it."""
        with self._lock:
            self.limits = replace(
                self.limits,
                **{
                    k: v
                    for k, v in (
                        ("requests", requests),
                        ("input_tokens", input_tokens),
                        ("output_tokens", output_tokens),
                    )
                    if v is not None
                },
            )
            now = self.clock()
            for unit, bucket in self._buckets.items():
                bucket.resize(self.limits.of(unit), now)

    def queue_error(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> None:
        """Answer the next admitted-or-not request with this error instead (529 overloaded_error, a spend limit...)."""
        with self._lock:
            self._queued_errors.append((status, error_type, message, dict(headers or {})))

    # --- counters -------------------------------------------------------------------------------

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._records)

    def stats(self) -> dict[str, Any]:
        """The counters as JSON-safe values (what ``GET /_fake/stats`` answers)."""
        records = self.records()
        usage: Counter[str] = Counter()
        for record in records:
            usage.update(record.usage)
        return {
            "answers": {str(k): v for k, v in sorted(Counter(r.status for r in records).items())},
            "rate_limited": sum(1 for r in records if r.status == 429),
            "admitted": [[r.at, r.counted_input] for r in records if r.status == 200],
            "usage": dict(usage),
            "limits": {unit: self.limits.of(unit) for unit in UNITS},
        }

    # --- the server -----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[FakeAnthropic]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path != "/_fake/stats":
                    self._send(404, _error("not_found_error", "Not found"), {})
                    return
                self._send(200, fake.stats(), {})

            def do_POST(self) -> None:
                length = self.headers.get("content-length", "")
                if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                    self.close_connection = True
                    self._send(413, _error("request_too_large", "Request exceeds the maximum allowed size"), {})
                    return
                raw = self.rfile.read(int(length))
                status, payload, headers = fake.handle(self.path, self.headers, raw)
                self._send(status, payload, headers)

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (a run worker killed mid-call)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.request_queue_size = 256  # many run workers at once; the default backlog of 5 resets connections
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fake-anthropic", daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            self._thread.join(timeout=5)

    # --- one request ----------------------------------------------------------------------------

    def handle(self, path: str, headers: Any, raw: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, JSON body, headers) for one request: what the handler sends."""
        request_id = f"req_{uuid.uuid4().hex[:24]}"
        base = {"request-id": request_id}
        if path != "/v1/messages":
            return 404, _error("not_found_error", f"Not found: {path[:100]}", request_id), base
        if headers.get("x-api-key") != self.api_key:
            return 401, _error("authentication_error", "invalid x-api-key", request_id), base
        if not headers.get("anthropic-version"):
            return 400, _error("invalid_request_error", "anthropic-version: header is required", request_id), base
        try:
            body = _validated(json.loads(raw))
            blocks = prompt_blocks(body)
        except ValueError:
            return 400, _error("invalid_request_error", "body: not valid JSON", request_id), base
        except RequestError as exc:
            return exc.status, _error(exc.error_type, exc.message, request_id), base
        with self._lock:
            if self._queued_errors:
                status, error_type, message, extra = self._queued_errors.pop(0)
                self._record(status, 0, {})
                return status, _error(error_type, message, request_id), {**base, **extra}
            now = self.clock()
            plan = self._plan(body["model"], blocks, now)
            for bucket in self._buckets.values():
                bucket.refill(now)
            need = {"requests": 1, "input_tokens": plan.counted_input, "output_tokens": body["max_tokens"]}
            waits = {unit: self._buckets[unit].seconds_until(amount) for unit, amount in need.items()}
            short = [unit for unit, wait in waits.items() if wait > 0]
            if short:
                self._record(429, plan.counted_input, {})
                wait = max(waits[u] for u in short)
                retry_after = 60 if math.isinf(wait) else max(1, math.ceil(wait))
                message = f"This request would exceed your organization's rate limit of {self._describe(short[0])}."
                return (
                    429,
                    _error("rate_limit_error", message, request_id),
                    {**base, **self._headers(now), "retry-after": str(retry_after)},
                )
            for unit, amount in need.items():
                self._buckets[unit].level -= amount
            admitted_at = self.wall()
            for key in plan.reads:
                self._cache[key] = max(self._cache[key], now + TTL_SECONDS["5m"])
            for key, ttl in plan.writes:
                self._cache[key] = max(self._cache.get(key, 0.0), now + ttl)
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        answered = self.answer(body)
        content = answered["content"]
        output_tokens = min(body["max_tokens"], max(1, sum(tokens_of(b) for b in content)))
        usage = {
            "input_tokens": plan.uncached_tokens,
            "cache_creation_input_tokens": plan.write_tokens,
            "cache_read_input_tokens": plan.read_tokens,
            "output_tokens": output_tokens,
        }
        with self._lock:
            now = self.clock()
            output = self._buckets["output_tokens"]
            output.refill(now)
            output.level = min(output.capacity, output.level + body["max_tokens"] - output_tokens)
            self._record(200, plan.counted_input, usage, at=admitted_at)
            limit_headers = self._headers(now)
        message = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": answered.get("stop_reason", "end_turn"),
            "stop_sequence": None,
            "usage": {
                **usage,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": plan.write_tokens - plan.write_1h_tokens,
                    "ephemeral_1h_input_tokens": plan.write_1h_tokens,
                },
                "service_tier": "standard",
            },
        }
        return 200, message, {**base, **limit_headers}

    def _plan(self, model: str, blocks: list[Block], now: float) -> CachePlan:
        """Caller holds the lock. Keys hash the model and the prefix's blocks (cache_control left out)."""
        prefix_tokens, keys, digest = [], [], hashlib.sha256(model.encode())
        running = 0
        for block in blocks:
            digest.update(block.identity.encode())
            running += block.tokens
            prefix_tokens.append(running)
            keys.append(digest.copy().hexdigest())
        total = running
        breakpoints = [i for i, b in enumerate(blocks) if b.cache_ttl is not None]
        candidates = {i for b in breakpoints for i in range(max(0, b - CACHE_LOOKBACK_BLOCKS), b + 1)}
        live = [i for i in candidates if self._cache.get(keys[i], -math.inf) > now]
        read_at = max(live, default=-1)
        read_tokens = prefix_tokens[read_at] if read_at >= 0 else 0
        writable = [b for b in breakpoints if b > read_at and prefix_tokens[b] >= self.cache_min_tokens]
        writes = tuple((keys[b], TTL_SECONDS[blocks[b].cache_ttl or "5m"]) for b in writable)
        write_tokens = prefix_tokens[writable[-1]] - read_tokens if writable else 0
        # Tokens written under a 1-hour breakpoint: from the read point to the last 1h breakpoint written.
        hour = [b for b in writable if blocks[b].cache_ttl == "1h"]
        write_1h = prefix_tokens[hour[-1]] - read_tokens if hour else 0
        return CachePlan(
            total_tokens=total,
            read_tokens=read_tokens,
            write_tokens=write_tokens,
            write_1h_tokens=write_1h,
            reads=(keys[read_at],) if read_at >= 0 else (),
            writes=writes,
        )

    def _record(self, status: int, counted_input: int, usage: dict[str, int], at: float | None = None) -> None:
        self._records.append(Record(self.wall() if at is None else at, status, counted_input, usage))

    def _describe(self, unit: str) -> str:
        return f"{self.limits.of(unit):,} {unit.replace('_', ' ')} per minute"

    def _headers(self, now: float) -> dict[str, str]:
        """Caller holds the lock and has refilled the buckets to ``now``."""
        headers: dict[str, str] = {}
        wall = self.wall()
        for unit, name in (
            ("requests", "requests"),
            ("input_tokens", "input-tokens"),
            ("output_tokens", "output-tokens"),
        ):
            bucket = self._buckets[unit]
            remaining = math.floor(bucket.level) if unit == "requests" else _nearest_thousand(bucket.level)
            headers[f"anthropic-ratelimit-{name}-limit"] = str(self.limits.of(unit))
            headers[f"anthropic-ratelimit-{name}-remaining"] = str(max(0, remaining))
            headers[f"anthropic-ratelimit-{name}-reset"] = _rfc3339(wall + bucket.seconds_to_full())
        # Without workspace limits, "tokens" is the total of input and output tokens.
        inputs, outputs = self._buckets["input_tokens"], self._buckets["output_tokens"]
        headers["anthropic-ratelimit-tokens-limit"] = str(self.limits.input_tokens + self.limits.output_tokens)
        headers["anthropic-ratelimit-tokens-remaining"] = str(_nearest_thousand(inputs.level + outputs.level))
        headers["anthropic-ratelimit-tokens-reset"] = _rfc3339(
            wall + max(inputs.seconds_to_full(), outputs.seconds_to_full())
        )
        return headers


def _error(error_type: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"type": "error", "error": {"type": error_type, "message": message}}
    if request_id:
        payload["request_id"] = request_id
    return payload


def remote_stats(base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The counters of a fake running in another process, read over HTTP."""
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        response = client.get(f"{base_url}/_fake/stats")
        response.raise_for_status()
        return response.json()
