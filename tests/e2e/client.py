#!/usr/bin/env python3
"""End-to-end scenario: the official Python MCP SDK against idem's example server.

    python client.py --server target/debug/examples/mcp_server --transport stdio
    python client.py --server target/debug/examples/mcp_server --transport http [--port N]

The script starts the server itself (over stdio the SDK spawns it; over HTTP this script does),
on a fresh SQLite ledger in a temporary directory, runs the scenario, prints a transcript of what
it sent and what came back, and exits non-zero on the first failed expectation. The server's own
log (stderr) goes to a file whose tail is printed when something fails.

Scenario, over each transport:
  1. tools/list: idempotentHint exactly on charge_card, charge_card_confirmed, create_shipment, send_email;
     readOnlyHint on list_charges and idem_status.
  2. a charge, then the same call again: the same receipt, the second marked replayed.
  3. N concurrent identical charges on a slow processor: one charge, N-1 "in flight" refusals
     that name idem_status; idem_status answers for the ref and ends "completed" with the receipt.
  4. a changed amount (a key argument): a second, new charge.
  5. a changed description (not a key argument): a conflict naming `description`, not its value.
  6. HTTP only: another tenant's identical call is its own new operation, and that tenant cannot
     see the first tenant's ref or its charges (list_charges is per tenant); a request without a
     valid bearer token is answered 401.
  7. multi-round-trip requests (MRTR): charge_card_confirmed above 200.00 answers input_required;
     the SDK's elicitation callback accepts and the continuation charges once; the same call again is
     a replay that asks nothing; driven by hand, the continuation (inputResponses + idem's sealed
     requestState) sent twice charges once (the second is a replay); a declined confirmation
     charges nothing.
  8. tasks: a second client declares io.modelcontextprotocol/tasks (an SDK ClientExtension that
     claims `resultType: "task"` answers and polls `tasks/get`, sent raw through the SDK's session:
     the SDK has no task API of its own); of 3 concurrent identical create_shipment calls one runs
     and two get its task (the same taskId, the operation's ref), polled working -> completed with
     the same result; a client without the extension gets "in flight" instead.
  9. restart: stop the server, start it on the same SQLite file, repeat step 2's call: replayed,
     the same receipt, and the (in-memory) processor made no new charge; `tasks/get` for step 8's
     taskId answers completed with the same result, and the shipment's repeat has the same ref.

`--transport failover --processor target/debug/examples/processor` runs another scenario: two
replicas over HTTP on one SQLite ledger, both charging through the processor example (an HTTP
service behind idem's IdempotencyLayer); a charge on replica A, A SIGKILLed while the processor
charges; once A's lease lapses the same call through replica B: exactly one charge at the
processor, under the key the receipt names, and B's log says the processor answered from its
record (its `Idempotent-Replayed` reply).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult, Request, RequestParams, Result
from pydantic import TypeAdapter

KEYED_TOOLS = {"charge_card", "charge_card_confirmed", "create_shipment", "send_email"}
READ_ONLY_TOOLS = {"list_charges", "idem_status"}
STATUS_TOOL = "idem_status"
REF_PATTERN = re.compile(r"^[0-9a-f]{16}$")

TENANT_A = "acme:alice"
TENANT_B = "globex:bob"

CALL_TIMEOUT_S = 30.0  # any single MCP request
STARTUP_TIMEOUT_S = 30.0  # the HTTP server accepting connections
STATUS_POLL_TIMEOUT_S = 15.0  # idem_status reaching "completed"

# The charge of step 2, reused by the conflict, other-tenant and restart steps.
FIRST_CHARGE = {"card": "tok_visa", "amount_cents": 1000, "description": "order 1001"}


# --------------------------------------------------------------------------- transcript


def say(line: str = "") -> None:
    print(line, flush=True)


def step(title: str) -> None:
    say()
    say(f"== {title}")


def sent(tool: str, arguments: dict[str, Any], note: str = "") -> None:
    say(f"  -> {tool} {json.dumps(arguments, sort_keys=True)}{note}")


def got(line: str) -> None:
    say(f"  <- {line}")


# --------------------------------------------------------------------------- reading results


OUTCOME_META_KEY = "dev.idem/outcome"


def idem_meta(result: Any) -> dict[str, Any]:
    """idem's outcome object in a tool result's `_meta` (under `dev.idem/outcome`; {} when absent)."""
    meta = result.meta or {}
    value = meta.get(OUTCOME_META_KEY)
    return value if isinstance(value, dict) else {}


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


def content_of(result: Any) -> list[dict[str, Any]]:
    """The content blocks as plain JSON, for byte-for-byte comparisons of a replay."""
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]


def replayed_content_of(result: Any) -> list[dict[str, Any]]:
    """A replay's content blocks without the line idem appends for the model (asserted here: it
    names the ref and says nothing ran again), for comparison with the first answer's."""
    blocks = content_of(result)
    assert blocks, "a replay without content"
    note = blocks[-1]
    ref = idem_meta(result).get("ref")
    assert note.get("type") == "text" and f"ref {ref}" in note.get("text", ""), f"no replay note naming ref {ref}: {note!r}"
    assert "nothing was executed again" in note["text"], f"the replay note does not say nothing ran again: {note!r}"
    return blocks[:-1]


def describe(result: Any) -> str:
    idem = idem_meta(result)
    if result.is_error:
        fields = {k: idem[k] for k in ("code", "ref", "differing", "executed", "retry", "statusTool") if k in idem}
        codes = json.dumps(fields, sort_keys=True) if fields else "(no idem outcome in _meta)"
        return f"isError {codes} text={text_of(result)!r}"
    content = result.structured_content if result.structured_content is not None else text_of(result)
    body = json.dumps(content, sort_keys=True)
    if not idem:
        return f"ok (no idem outcome in _meta) result={body}"
    return f"ok ref={idem.get('ref')} replayed={idem.get('replayed')} result={body}"


def assert_fresh_or_replayed(result: Any, replayed: bool, what: str) -> str:
    """A served (not refused) result with an outcome with `replayed == replayed`; returns its ref."""
    idem = idem_meta(result)
    assert not result.is_error, f"{what}: expected a result, got an error: {describe(result)}"
    assert idem, f"{what}: the result has no idem outcome in _meta: {describe(result)}"
    ref = idem.get("ref")
    assert isinstance(ref, str) and REF_PATTERN.match(ref), f"{what}: the outcome ref is not 16 hex digits: {ref!r}"
    assert idem.get("replayed") is replayed, f"{what}: expected replayed == {replayed}, got {idem.get('replayed')!r}"
    return ref


def assert_refusal(result: Any, code: str, what: str) -> dict[str, Any]:
    """An isError refusal with outcome code `code`, marked not executed; returns the outcome object."""
    idem = idem_meta(result)
    assert result.is_error, f"{what}: expected an isError refusal ({code}), got {describe(result)}"
    assert idem.get("code") == code, f"{what}: expected code {code!r}, got {describe(result)}"
    assert idem.get("executed") is False, f"{what}: a refusal must say executed == false: {idem}"
    assert idem.get("retry") in ("no", "safe"), f"{what}: retry must be 'no' or 'safe': {idem}"
    ref = idem.get("ref")
    assert isinstance(ref, str) and REF_PATTERN.match(ref), f"{what}: refusal ref is not 16 hex digits: {ref!r}"
    assert idem.get("statusTool") == STATUS_TOOL, f"{what}: statusTool should be {STATUS_TOOL!r}: {idem}"
    return idem


def contains(haystack: Any, needle: Any) -> bool:
    """Whether `needle` equals `haystack` or any value nested in it."""
    if haystack == needle:
        return True
    if isinstance(haystack, dict):
        return any(contains(value, needle) for value in haystack.values())
    if isinstance(haystack, list):
        return any(contains(value, needle) for value in haystack)
    return False


# --------------------------------------------------------------------------- tool calls


async def call(client: Client, tool: str, arguments: dict[str, Any], note: str = "") -> Any:
    sent(tool, arguments, note)
    result = await client.call_tool(tool, arguments)
    got(describe(result))
    return result


async def charges(client: Client) -> list[dict[str, Any]]:
    """What the fake processor really did (list_charges), quietly."""
    result = await client.call_tool("list_charges", {})
    assert not result.is_error, f"list_charges failed: {describe(result)}"
    body = result.structured_content
    assert isinstance(body, dict) and isinstance(body.get("charges"), list), f"list_charges: unexpected {body!r}"
    return body["charges"]


async def charge_count(client: Client, label: str) -> int:
    count = len(await charges(client))
    say(f"  .. list_charges ({label}): {count} charge(s)")
    return count


async def status(client: Client, ref: str) -> Any:
    return await call(client, STATUS_TOOL, {"ref": ref})


# --------------------------------------------------------------------------- servers and connections


@dataclass
class Setup:
    binary: str
    workdir: Path
    delay_ms: int
    concurrency: int

    @property
    def database_url(self) -> str:
        return f"sqlite://{self.workdir / 'ledger.sqlite3'}?mode=rwc"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    def server_env(self) -> dict[str, str]:
        return {
            "IDEM_DATABASE_URL": self.database_url,
            "RUST_LOG": os.environ.get("RUST_LOG", "info"),
            "NO_COLOR": "1",
        }


@asynccontextmanager
async def stdio_connection(setup: Setup, caller: str = TENANT_A, **options: Any) -> AsyncIterator[Client]:
    """Spawn the server over stdio (the SDK owns the process) with `caller` as its local identity;
    `options` go to `Client` (extensions, an elicitation callback)."""
    params = StdioServerParameters(
        command=setup.binary,
        args=["--processor-delay-ms", str(setup.delay_ms)],
        env=setup.server_env() | {"IDEM_LOCAL_CALLER": caller},
    )
    with open(setup.log_path, "a", encoding="utf-8") as errlog:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=CALL_TIMEOUT_S, **options) as client:
            say(f"  .. connected over stdio as {caller}, protocol {client.protocol_version}")
            yield client


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HttpServer:
    """The example server as a child process serving streamable HTTP at /mcp."""

    def __init__(self, setup: Setup, port: int, extra: tuple[str, ...] = ()) -> None:
        self.setup = setup
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.extra = list(extra)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            self.setup.binary,
            "--http",
            f"127.0.0.1:{self.port}",
            "--processor-delay-ms",
            str(self.setup.delay_ms),
            *self.extra,
        ]
        with open(self.setup.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, env=os.environ | self.setup.server_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            code = self.process.poll()
            assert code is None, f"the HTTP server exited during startup with status {code}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    say(f"  .. server pid {self.process.pid} listening at {self.url}")
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(
            f"the HTTP server did not accept connections on port {self.port} within {STARTUP_TIMEOUT_S}s"
        )

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, as a crashed replica does."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
            say(f"  .. server pid {self.process.pid} SIGKILLed")

    def stop(self) -> None:
        """Ctrl-C (the server's graceful shutdown), then a kill if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        say(f"  .. server pid {self.process.pid} stopped (exit status {self.process.returncode})")


@asynccontextmanager
async def http_connection(server: HttpServer, token: str, **options: Any) -> AsyncIterator[Client]:
    """Connect over streamable HTTP with `Authorization: Bearer <token>` on every request; `options`
    go to `Client` (extensions, an elicitation callback)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(CALL_TIMEOUT_S)) as http:
        transport = streamable_http_client(server.url, http_client=http)
        async with Client(transport, read_timeout_seconds=CALL_TIMEOUT_S, **options) as client:
            say(f"  .. connected over HTTP as {token}, protocol {client.protocol_version}")
            yield client


# --------------------------------------------------------------------------- scenario steps


async def check_tools_list(client: Client) -> None:
    step("tools/list: idempotentHint exactly on the keyed tools")
    say("  -> tools/list")
    listing = await client.list_tools()
    hints: dict[str, dict[str, Any]] = {}
    for tool in listing.tools:
        annotations = tool.annotations
        hints[tool.name] = {
            "idempotentHint": annotations.idempotent_hint if annotations else None,
            "readOnlyHint": annotations.read_only_hint if annotations else None,
        }
        got(f"{tool.name}: {json.dumps(hints[tool.name])}")
    names = set(hints)
    expected = KEYED_TOOLS | READ_ONLY_TOOLS
    assert names == expected, f"tools/list: expected the tools {sorted(expected)}, got {sorted(names)}"
    idempotent = {name for name, h in hints.items() if h["idempotentHint"] is True}
    assert idempotent == KEYED_TOOLS, f"idempotentHint: true on {sorted(idempotent)}, expected {sorted(KEYED_TOOLS)}"
    read_only = {name for name, h in hints.items() if h["readOnlyHint"] is True}
    assert read_only == READ_ONLY_TOOLS, (
        f"readOnlyHint: true on {sorted(read_only)}, expected {sorted(READ_ONLY_TOOLS)}"
    )
    # The keyed tools return Json<T>: idem states the outputSchema its rewrite hides from rmcp.
    without_schema = {tool.name for tool in listing.tools if tool.name in KEYED_TOOLS and not tool.output_schema}
    assert not without_schema, f"keyed tools without an outputSchema: {sorted(without_schema)}"
    # Each keyed tool advertises its recipe in its definition's _meta.
    recipes = {tool.name: (getattr(tool, "meta", None) or {}).get("dev.idem/recipe") for tool in listing.tools}
    without_recipe = {name for name in KEYED_TOOLS if not (recipes.get(name) or {}).get("key")}
    assert not without_recipe, f"keyed tools without dev.idem/recipe in _meta: {sorted(without_recipe)}"
    got(f"charge_card recipe: {json.dumps(recipes.get('charge_card'), sort_keys=True)}")


async def check_sequential_repeat(client: Client) -> Any:
    """Step 2; returns the first charge's result."""
    step("a charge, then the same call again")
    before = await charge_count(client, "before")
    first = await call(client, "charge_card", FIRST_CHARGE)
    ref = assert_fresh_or_replayed(first, replayed=False, what="first charge")
    receipt = first.structured_content
    assert isinstance(receipt, dict) and receipt.get("charge_id"), f"first charge: no receipt in {describe(first)}"
    forwarded = str(receipt.get("reference", ""))
    assert len(forwarded) == 64 and all(c in "0123456789abcdef" for c in forwarded), (
        f"the key forwarded to the processor ({forwarded!r}) is not 64 hex digits"
    )
    again = await call(client, "charge_card", FIRST_CHARGE, note="   (repeat)")
    assert assert_fresh_or_replayed(again, replayed=True, what="repeated charge") == ref, "the repeat has another ref"
    assert again.structured_content == receipt, f"the repeat's receipt differs: {again.structured_content} != {receipt}"
    assert replayed_content_of(again) == content_of(first), "the repeat's content blocks differ from the first answer's"
    after = await charge_count(client, "after")
    assert after == before + 1, f"one charge expected from a charge and its repeat, the processor made {after - before}"
    return first


async def check_concurrent_repeats(client: Client, setup: Setup) -> None:
    n = setup.concurrency
    step(f"{n} concurrent identical charges (processor delay {setup.delay_ms} ms)")
    arguments = {"card": "tok_mastercard", "amount_cents": 2000, "description": "concurrent"}
    before = await charge_count(client, "before")
    sent("charge_card", arguments, note=f"   x{n}, concurrently")
    started = time.monotonic()
    tasks = [asyncio.create_task(client.call_tool("charge_card", arguments)) for _ in range(n)]

    # The refusals come back at once; ask idem_status while the winner is (normally) still running.
    deadline = started + CALL_TIMEOUT_S
    while sum(task.done() for task in tasks) < n - 1 and time.monotonic() < deadline:
        pending = [task for task in tasks if not task.done()]
        await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED)
    early = [task.result() for task in tasks if task.done()]
    say(f"  .. {len(early)} answer(s) after {time.monotonic() - started:.2f}s, {n - len(early)} still running")
    early_refs = {idem_meta(r).get("ref") for r in early if idem_meta(r).get("ref")}
    if len(early_refs) == 1:
        (ref,) = early_refs
        during = await status(client, ref)
        assert not during.is_error, f"idem_status for the in-flight ref failed: {describe(during)}"
        state = (during.structured_content or {}).get("state")
        assert state in ("in_progress", "completed"), f"idem_status while running: unexpected state {state!r}"
        say(f"  .. idem_status while the winner runs: state {state}")

    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=CALL_TIMEOUT_S)
    say(f"  .. all {n} answered after {time.monotonic() - started:.2f}s")
    fresh = [r for r in results if not r.is_error and idem_meta(r).get("replayed") is False]
    in_flight = [r for r in results if r.is_error and idem_meta(r).get("code") == "in_flight"]
    others = [r for r in results if r not in fresh and r not in in_flight]
    got(f"{len(fresh)} new charge(s), {len(in_flight)} in_flight refusal(s), {len(others)} other answer(s)")
    for result in fresh:
        got(f"new: {describe(result)}")
    if in_flight:
        got(f"in_flight (first of {len(in_flight)}): {describe(in_flight[0])}")
    for result in others:
        got(f"other: {describe(result)}")
    assert len(fresh) == 1, f"exactly one call should have run, {len(fresh)} did"
    assert len(in_flight) == n - 1, f"{n - 1} in_flight refusals expected, got {len(in_flight)}; others: {others}"
    (winner,) = fresh
    ref = assert_fresh_or_replayed(winner, replayed=False, what="the winning call")
    receipt = winner.structured_content
    for refusal in in_flight:
        idem = assert_refusal(refusal, "in_flight", "a concurrent repeat")
        assert idem["ref"] == ref, f"an in_flight refusal names ref {idem['ref']}, the winner's is {ref}"
        words = text_of(refusal)
        assert STATUS_TOOL in words, f"the in_flight text does not name {STATUS_TOOL}: {words!r}"
        assert ref in words, f"the in_flight text does not give the ref {ref}: {words!r}"
        assert "not submit" in words.lower(), f"the in_flight text does not say not to submit again: {words!r}"

    await poll_status_until_completed(client, ref, receipt)
    after = await charge_count(client, "after")
    assert after == before + 1, f"{n} concurrent identical calls made {after - before} charges, expected 1"
    again = await call(client, "charge_card", arguments, note="   (once more, after completion)")
    assert assert_fresh_or_replayed(again, replayed=True, what="repeat after completion") == ref
    assert again.structured_content == receipt, "the replay after completion has another receipt"


async def poll_status_until_completed(client: Client, ref: str, receipt: Any) -> None:
    """Ask idem_status for `ref` until it says completed (bounded), then check it holds `receipt`."""
    deadline = time.monotonic() + STATUS_POLL_TIMEOUT_S
    polls = 0
    while True:
        polls += 1
        result = await client.call_tool(STATUS_TOOL, {"ref": ref})
        assert not result.is_error, f"idem_status {ref}: {describe(result)}"
        body = result.structured_content or {}
        if body.get("state") == "completed":
            break
        assert body.get("state") == "in_progress", f"idem_status {ref}: unexpected state in {body}"
        assert time.monotonic() < deadline, (
            f"idem_status {ref} still {body.get('state')} after {STATUS_POLL_TIMEOUT_S}s"
        )
        await asyncio.sleep(0.1)
    sent(STATUS_TOOL, {"ref": ref}, note=f"   (polled {polls}x until completed)")
    got(describe(result))
    for field in ("ref", "state", "advice", "expiresAt", "result"):
        assert field in body, f"idem_status: no `{field}` in {body}"
    assert body["ref"] == ref, f"idem_status answered for ref {body['ref']}, asked {ref}"
    assert contains(body["result"], receipt), (
        f"idem_status result {body['result']!r} does not hold the receipt {receipt}"
    )


async def check_changed_amount(client: Client, first: Any) -> None:
    step("a changed amount (a key argument) is a new charge")
    before = await charge_count(client, "before")
    changed = FIRST_CHARGE | {"amount_cents": 1250}
    result = await call(client, "charge_card", changed)
    ref = assert_fresh_or_replayed(result, replayed=False, what="changed amount")
    assert ref != idem_meta(first)["ref"], "a changed amount got the first charge's ref"
    assert result.structured_content != first.structured_content, "a changed amount got the first charge's receipt"
    after = await charge_count(client, "after")
    assert after == before + 1, f"a changed amount should make one new charge, made {after - before}"


async def check_conflict(client: Client, first: Any) -> None:
    step("a changed description (not a key argument) is a conflict")
    before = await charge_count(client, "before")
    secret = "gift for Ms. Quartermaine, do not tell"
    result = await call(client, "charge_card", FIRST_CHARGE | {"description": secret})
    idem = assert_refusal(result, "conflict", "changed description")
    assert idem["ref"] == idem_meta(first)["ref"], f"the conflict names ref {idem['ref']}, not the first charge's"
    differing = idem.get("differing")
    assert isinstance(differing, list) and "description" in differing, f"differing should name description: {idem}"
    assert "amount_cents" not in differing and "card" not in differing, f"differing names an unchanged argument: {idem}"
    everything = text_of(result) + json.dumps(result.meta)
    for value in (secret, FIRST_CHARGE["description"]):
        assert value not in everything, f"the conflict answer reveals the value {value!r}: {everything!r}"
    after = await charge_count(client, "after")
    assert after == before, f"a conflict must not charge, the processor made {after - before}"


async def check_other_tenant(server: HttpServer, first: Any) -> None:
    step(f"another tenant ({TENANT_B}) makes the same call")
    first_ref = idem_meta(first)["ref"]
    async with http_connection(server, TENANT_B) as other:
        before = await charge_count(other, "before")
        result = await call(other, "charge_card", FIRST_CHARGE)
        ref = assert_fresh_or_replayed(result, replayed=False, what=f"{TENANT_B}'s charge")
        assert ref != first_ref, f"{TENANT_B} got {TENANT_A}'s ref {first_ref}"
        assert result.structured_content != first.structured_content, f"{TENANT_B} got {TENANT_A}'s receipt"
        after = await charge_count(other, "after")
        assert after == before + 1, f"{TENANT_B}'s charge should be a new charge, the processor made {after - before}"
        again = await call(other, "charge_card", FIRST_CHARGE, note="   (repeat)")
        assert assert_fresh_or_replayed(again, replayed=True, what=f"{TENANT_B}'s repeat") == ref
        # list_charges shows the caller's tenant only: never the first tenant's charges.
        tenant_b = TENANT_B.split(":")[0]
        listed = await charges(other)
        assert all(c.get("tenant") == tenant_b for c in listed), f"{TENANT_B} sees other tenants' charges: {listed}"
        first_charge = (first.structured_content or {}).get("charge_id")
        assert all(c.get("charge_id") != first_charge for c in listed), f"{TENANT_B} sees {TENANT_A}'s charge"

        foreign = await status(other, first_ref)
        assert foreign.is_error, f"{TENANT_B} can read {TENANT_A}'s operation: {describe(foreign)}"
        assert "no operation with ref" in text_of(foreign), f"unexpected words for a foreign ref: {text_of(foreign)!r}"
        assert "tok_visa" not in text_of(foreign) and "charge_id" not in text_of(foreign), "the refusal leaks data"
        unknown = await status(other, "0123456789abcdef")
        assert unknown.is_error and "no operation with ref" in text_of(unknown), "an unknown ref should be not found"


async def check_unauthenticated(server: HttpServer) -> None:
    step("HTTP requests without a valid bearer token")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    # One connection per request: a 401 answered before its body is read may close the connection,
    # and a kept-alive client's next request would race that close.
    base = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Connection": "close",
    }
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(CALL_TIMEOUT_S)) as http:
        for label, extra in (
            ("no Authorization header", {}),
            ("a token that is not tenant:subject", {"Authorization": "Bearer nobody"}),
            ("another scheme", {"Authorization": f"Basic {TENANT_A}"}),
        ):
            say(f"  -> POST {server.url} tools/list, {label}")
            response = await http.post(server.url, json=body, headers=base | extra)
            got(f"HTTP {response.status_code} {response.text[:80]!r}")
            assert response.status_code == 401, f"{label}: expected HTTP 401, got {response.status_code}"


async def check_replay_after_restart(client: Client, first: Any) -> None:
    """The server was restarted on the same SQLite file: step 2's call replays from the ledger."""
    count = await charge_count(client, "new process, before")
    result = await call(client, "charge_card", FIRST_CHARGE)
    ref = assert_fresh_or_replayed(result, replayed=True, what="repeat after restart")
    assert ref == idem_meta(first)["ref"], f"after restart the ref is {ref}, it was {idem_meta(first)['ref']}"
    assert result.structured_content == first.structured_content, "after restart the receipt differs"
    assert replayed_content_of(result) == content_of(first), "after restart the content blocks differ"
    after = await charge_count(client, "new process, after")
    assert after == count, f"the replay after restart made {after - count} new charge(s)"


# --------------------------------------------------------------------------- MCP 2026-07-28: MRTR and tasks

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
CONFIRM_ABOVE_CENTS = 20000  # charge_card_confirmed asks above 200.00


class TaskHandle(Result):
    """A `tools/call` answered with a task (`resultType: "task"`, SEP-2663)."""

    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class GetTaskParams(RequestParams):
    task_id: str


class GetTask(Request[GetTaskParams, Literal["tasks/get"]]):
    """`tasks/get`, sent raw through the SDK's session: the SDK 2.3.0 has no task API of its own."""

    method: Literal["tasks/get"] = "tasks/get"
    name_param: ClassVar[str | None] = "taskId"


async def get_task(session: Any, task_id: str) -> dict[str, Any]:
    return await session.send_request(GetTask(params=GetTaskParams(task_id=task_id)), TypeAdapter(dict[str, Any]))


class Tasks(ClientExtension):
    """The tasks extension for the official client: declared in the client's capabilities, it claims
    `resultType: "task"` answers and resolves them by polling `tasks/get` until a terminal status."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self.handles: list[dict[str, Any]] = []
        self.polls: list[dict[str, Any]] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve),)

    async def resolve(self, handle: TaskHandle, context: ClaimContext) -> CallToolResult:
        self.handles.append(handle.model_dump(mode="json", by_alias=True, exclude_none=True))
        deadline = time.monotonic() + STATUS_POLL_TIMEOUT_S
        while True:
            task = await get_task(context.session, handle.task_id)
            self.polls.append(task)
            if task.get("status") != "working":
                break
            assert time.monotonic() < deadline, f"task {handle.task_id} still working after {STATUS_POLL_TIMEOUT_S}s"
            await asyncio.sleep(min(handle.poll_interval_ms or 200, 200) / 1000)
        assert task.get("status") == "completed", f"task {handle.task_id} ended {task.get('status')}: {task}"
        return CallToolResult.model_validate(task["result"])


class Confirmations:
    """The elicitation callback the SDK answers input requests with: accepts or declines, and counts."""

    def __init__(self) -> None:
        self.accept = True
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params.message)
        action = "accept" if self.accept else "decline"
        got(f"elicitation {params.message!r} -> {action}")
        return ElicitResult(action=action, content={} if self.accept else None)


async def check_mrtr(client: Client, confirmations: Confirmations, label: str) -> None:
    step("multi-round-trip requests: a charge above 200.00 asks to confirm first")
    charge = {"card": "tok_amex", "amount_cents": 24000, "description": f"order 2001 ({label})"}
    before = await charge_count(client, "before")
    confirmations.accept, confirmations.asked = True, []
    first = await call(client, "charge_card_confirmed", charge, note="   (the user accepts)")
    ref = assert_fresh_or_replayed(first, replayed=False, what="the confirmed charge")
    assert len(confirmations.asked) == 1, f"one confirmation expected, asked {confirmations.asked}"
    assert "240.00" in confirmations.asked[0], f"the confirmation does not name the amount: {confirmations.asked}"
    assert await charge_count(client, "after the confirmed charge") == before + 1, "the confirmed charge did not charge once"

    again = await call(client, "charge_card_confirmed", charge, note="   (the same call again)")
    assert assert_fresh_or_replayed(again, replayed=True, what="a repeat of the confirmed call") == ref
    assert again.structured_content == first.structured_content, "the repeat's receipt differs"
    assert len(confirmations.asked) == 1, "a repeat of a completed charge asked to confirm again"
    assert await charge_count(client, "after the repeat") == before + 1, "the repeat charged again"

    step("multi-round-trip requests, driven by hand: the continuation, then the same continuation again")
    charge = {"card": "tok_amex", "amount_cents": 26000, "description": f"order 2002 ({label})"}
    sent("charge_card_confirmed", charge, note="   (round 1, allow_input_required)")
    asked = await client.session.call_tool("charge_card_confirmed", charge, allow_input_required=True)
    assert isinstance(asked, InputRequiredResult), f"expected input_required, got {asked!r}"
    dumped = asked.model_dump(mode="json", by_alias=True, exclude_none=True)
    got(json.dumps(dumped, sort_keys=True)[:400])
    state = asked.request_state
    assert state and state.startswith("idem1."), f"the requestState is not idem's sealed state: {state!r}"
    assert set(asked.input_requests or {}) == {"confirm"}, f"unexpected input requests {asked.input_requests}"
    outcome = (asked.meta or {}).get(OUTCOME_META_KEY) or {}
    assert outcome.get("executed") is False, f"an input request must say executed == false: {outcome}"
    assert await charge_count(client, "after round 1") == before + 1, "asking charged"
    responses = {"confirm": {"action": "accept", "content": {}}}
    results = []
    for note in ("(round 2: inputResponses + requestState)", "(round 2 again, a new JSON-RPC id)"):
        sent("charge_card_confirmed", charge, note=f"   {note}")
        result = await client.session.call_tool(
            "charge_card_confirmed", charge, input_responses=responses, request_state=state
        )
        got(describe(result))
        results.append(result)
    continued, repeated = results
    ref = assert_fresh_or_replayed(continued, replayed=False, what="the continuation")
    assert assert_fresh_or_replayed(repeated, replayed=True, what="the repeated continuation") == ref
    assert repeated.structured_content == continued.structured_content, "the repeated continuation's receipt differs"
    assert await charge_count(client, "after both continuations") == before + 2, "a continuation charged twice"

    step("multi-round-trip requests: a declined confirmation charges nothing")
    charge = {"card": "tok_amex", "amount_cents": 31000, "description": f"order 2003 ({label})"}
    confirmations.accept, confirmations.asked = False, []
    declined = await call(client, "charge_card_confirmed", charge, note="   (the user declines)")
    assert declined.is_error, f"a declined confirmation should be an error result: {describe(declined)}"
    assert "not confirmed" in text_of(declined), f"unexpected words for a decline: {text_of(declined)!r}"
    assert len(confirmations.asked) == 1, f"one confirmation expected, asked {confirmations.asked}"
    assert await charge_count(client, "after the decline") == before + 2, "a declined charge charged"
    confirmations.accept = True


async def check_tasks(tasks_client: Client, tasks: Tasks, plain: Client, label: str) -> dict[str, Any]:
    """Concurrent identical create_shipment calls from a client that declared the tasks extension:
    one runs, the others get its task (the same taskId, the operation's ref) and poll `tasks/get`.
    Returns what the restart step checks again."""
    step(f"tasks: 3 concurrent identical create_shipment calls from a client that declared {TASKS_EXTENSION}")
    shipment = {"order_id": f"order-3001-{label}", "address": "1 Quay Street"}
    sent("create_shipment", shipment, note="   x3, concurrently")
    results = await asyncio.gather(*[tasks_client.call_tool("create_shipment", shipment) for _ in range(3)])
    for handle in tasks.handles:
        got(f"task handle {json.dumps(handle, sort_keys=True)}")
    statuses = [poll.get("status") for poll in tasks.polls]
    got(f"tasks/get x{len(statuses)} -> " + ", ".join(f"{s} x{statuses.count(s)}" for s in dict.fromkeys(statuses)))
    fresh = [r for r in results if idem_meta(r).get("replayed") is False]
    assert len(fresh) == 1, f"exactly one call should have run: {[describe(r) for r in results]}"
    ref = assert_fresh_or_replayed(fresh[0], replayed=False, what="the shipment that ran")
    task_ids = {handle["taskId"] for handle in tasks.handles}
    assert len(tasks.handles) == 2, f"the two repeats should have been answered with a task: {tasks.handles}"
    assert task_ids == {ref}, f"the repeats' taskIds {task_ids} are not the operation's ref {ref}"
    assert all(handle["status"] == "working" for handle in tasks.handles), "a task handle is not working"
    assert any(poll.get("status") == "working" for poll in tasks.polls), "tasks/get never said working"
    completed = [poll for poll in tasks.polls if poll.get("status") == "completed"]
    assert completed, "tasks/get never said completed"
    for result in results:
        assert result.structured_content == fresh[0].structured_content, f"a task's result differs: {describe(result)}"

    step("tasks: a client without the extension gets the in-flight answer instead")
    other = {"order_id": f"order-3002-{label}", "address": "2 Quay Street"}
    sent("create_shipment", other, note="   x2, concurrently, without the extension")
    both = await asyncio.gather(*[plain.call_tool("create_shipment", other) for _ in range(2)])
    for result in both:
        got(describe(result))
    assert sum(idem_meta(r).get("replayed") is False for r in both) == 1, "one of the two should have run"
    refused = [r for r in both if r.is_error]
    assert len(refused) == 1, f"the other should be refused in flight: {[describe(r) for r in both]}"
    assert_refusal(refused[0], "in_flight", "a repeat from a client without tasks")
    return {"shipment": shipment, "task_id": ref, "result": completed[-1]["result"], "first": fresh[0]}


async def check_task_after_restart(client: Client, before: dict[str, Any]) -> None:
    step("tasks after a restart: tasks/get for the same taskId, and a repeat with the same ref")
    task_id = before["task_id"]
    sent("tasks/get", {"taskId": task_id})
    task = await get_task(client.session, task_id)
    got(f"status {task.get('status')} taskId {task.get('taskId')}")
    assert task.get("taskId") == task_id and task.get("status") == "completed", f"after restart: {task}"
    assert task["result"].get("structuredContent") == before["result"].get("structuredContent"), (
        f"after restart the task's result differs: {task['result']} != {before['result']}"
    )
    again = await call(client, "create_shipment", before["shipment"], note="   (repeat after restart)")
    assert assert_fresh_or_replayed(again, replayed=True, what="the shipment after restart") == task_id
    assert again.structured_content == before["first"].structured_content, "after restart the receipt differs"


# --------------------------------------------------------------------------- the two runs


async def run_stdio(setup: Setup) -> None:
    step(f"stdio: server {setup.binary}, ledger {setup.database_url}, caller {TENANT_A}")
    confirmations = Confirmations()
    async with stdio_connection(setup, elicitation_callback=confirmations) as client:
        await check_tools_list(client)
        first = await check_sequential_repeat(client)
        await check_concurrent_repeats(client, setup)
        await check_changed_amount(client, first)
        await check_conflict(client, first)
        await check_mrtr(client, confirmations, "stdio")
        tasks = Tasks()
        async with stdio_connection(setup, extensions=[tasks]) as tasks_client:
            shipped = await check_tasks(tasks_client, tasks, client, "stdio")
    say("  .. stdio session closed: the server process has exited")
    step("restart: a new server process on the same SQLite file")
    async with stdio_connection(setup, extensions=[Tasks()]) as client:
        await check_replay_after_restart(client, first)
        await check_task_after_restart(client, shipped)


async def run_http(setup: Setup, port: int) -> None:
    server = HttpServer(setup, port)
    step(f"http: server {setup.binary}, ledger {setup.database_url}")
    server.start()
    try:
        await check_unauthenticated(server)
        confirmations = Confirmations()
        async with http_connection(server, TENANT_A, elicitation_callback=confirmations) as client:
            await check_tools_list(client)
            first = await check_sequential_repeat(client)
            await check_concurrent_repeats(client, setup)
            await check_changed_amount(client, first)
            await check_conflict(client, first)
            await check_other_tenant(server, first)
            await check_mrtr(client, confirmations, "http")
            tasks = Tasks()
            async with http_connection(server, TENANT_A, extensions=[tasks]) as tasks_client:
                shipped = await check_tasks(tasks_client, tasks, client, "http")
    finally:
        server.stop()
    step("restart: a new server process on the same SQLite file")
    server = HttpServer(setup, 0)
    server.start()
    try:
        async with http_connection(server, TENANT_A, extensions=[Tasks()]) as client:
            await check_replay_after_restart(client, first)
            await check_task_after_restart(client, shipped)
    finally:
        server.stop()


# --------------------------------------------------------------------------- failover through the processor


class ProcessorServer:
    """The processor example (a card processor behind idem's IdempotencyLayer) as a child process."""

    def __init__(self, binary: str, setup: Setup, delay_ms: int) -> None:
        self.binary = binary
        self.setup = setup
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.delay_ms = delay_ms
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [self.binary, "--http", f"127.0.0.1:{self.port}", "--delay-ms", str(self.delay_ms)]
        # Its ledger and charges in a file of this run's (by default they would outlive it).
        env = os.environ | {"IDEM_DATABASE_URL": str(self.setup.workdir / "processor.sqlite3"), "NO_COLOR": "1"}
        with open(self.setup.workdir / "processor.log", "ab") as log:
            self.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "the processor exited during startup"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    say(f"  .. processor pid {self.process.pid} at {self.url}")
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the processor did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    async def charges(self, merchant: str) -> list[dict[str, Any]]:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(CALL_TIMEOUT_S)) as http:
            response = await http.get(f"{self.url}/charges", headers={"Authorization": f"Bearer {merchant}"})
            assert response.status_code == 200, f"GET /charges: {response.status_code}"
            return response.json()


async def run_failover(setup: Setup, processor_binary: str) -> None:
    step("failover: two replicas on one SQLite ledger, charging through the processor example")
    processor = ProcessorServer(processor_binary, setup, delay_ms=2000)
    processor.start()
    extra = ("--processor", processor.url, "--lease-ms", "2000")
    a, b = HttpServer(setup, 0, extra), HttpServer(setup, 0, extra)
    try:
        a.start()
        b.start()
        arguments = {"card": "tok_visa", "amount_cents": 7100}

        async def first_attempt() -> None:
            async with http_connection(a, TENANT_A) as client:
                await call(client, "charge_card", arguments, "on replica A")

        attempt = asyncio.create_task(first_attempt())
        await asyncio.sleep(1.0)
        a.kill()
        try:
            await asyncio.wait_for(attempt, timeout=10)
            raise AssertionError("replica A answered although it was killed mid-charge")
        except AssertionError:
            raise
        except BaseException:  # noqa: BLE001 - the connection died with the replica: the answer is lost
            say("  .. the first attempt's answer was lost with replica A")
        # Replica A's lease lapses; the repeat through B reconciles by charging again under the
        # same key, which the processor answers from its record.
        result = None
        async with http_connection(b, TENANT_A) as client:
            for _ in range(10):
                await asyncio.sleep(1.0)
                result = await call(client, "charge_card", arguments, "the same call, on replica B")
                if not (result.is_error and idem_meta(result).get("code") == "in_flight"):
                    break
        assert result is not None and not result.is_error, f"replica B could not charge: {describe(result)}"
        receipt = result.structured_content
        assert isinstance(receipt, dict) and receipt.get("charge_id"), f"not a receipt: {receipt!r}"
        made = await processor.charges(TENANT_A.split(":")[0])
        say(f"  .. the processor's charges: {made}")
        assert len(made) == 1, f"exactly one charge at the processor, not {len(made)}: {made}"
        assert made[0]["reference"] == receipt["reference"], "the charge was made under the key the receipt names"
        log = setup.log_path.read_text(encoding="utf-8", errors="replace")
        assert "the processor answered from its record" in log, "B's charge was the processor's replay"
        say("  .. one charge at the processor; replica B got it replayed (Idempotent-Replayed)")
    finally:
        a.kill()
        b.stop()
        processor.stop()


# --------------------------------------------------------------------------- entry point


def failures(error: BaseException) -> list[BaseException]:
    """The leaf exceptions of a (possibly nested) exception group."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in failures(inner)]
    return [error]


def print_server_log(setup: Setup, lines: int = 40) -> None:
    if not setup.log_path.exists():
        return
    tail = setup.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    say(f"-- last {len(tail)} line(s) of the server log ({setup.log_path}):")
    for line in tail:
        say(f"   | {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="path to the mcp_server example binary")
    parser.add_argument("--transport", required=True, choices=["stdio", "http", "failover"])
    parser.add_argument("--processor", help="path to the processor example binary (--transport failover)")
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: a free one)")
    parser.add_argument("--delay-ms", type=int, default=1500, help="the server's --processor-delay-ms")
    parser.add_argument("--concurrency", type=int, default=20, help="concurrent identical charges")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (ledger, server log)")
    options = parser.parse_args()

    binary = shutil.which(options.server) or options.server
    if not os.access(binary, os.X_OK):
        say(f"FAILED: the server binary {options.server} does not exist or is not executable")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix=f"idem-e2e-{options.transport}-"))
    setup = Setup(
        binary=os.path.abspath(binary), workdir=workdir, delay_ms=options.delay_ms, concurrency=options.concurrency
    )
    started = time.monotonic()
    try:
        if options.transport == "stdio":
            asyncio.run(run_stdio(setup))
        elif options.transport == "failover":
            assert options.processor, "--transport failover needs --processor"
            asyncio.run(run_failover(setup, os.path.abspath(options.processor)))
        else:
            asyncio.run(run_http(setup, options.port))
    except BaseException as error:  # noqa: BLE001 - report every failure, then exit non-zero
        say()
        for leaf in failures(error):
            if isinstance(leaf, AssertionError):
                say(f"FAILED ({options.transport}): {leaf}")
            else:
                say(f"FAILED ({options.transport}) with {type(leaf).__name__}:")
                say("".join(traceback.format_exception(leaf)).rstrip())
        print_server_log(setup)
        say(f"(ledger and server log kept in {workdir})")
        return 1
    say()
    say(f"PASSED ({options.transport}) in {time.monotonic() - started:.1f}s")
    if options.keep:
        say(f"(ledger and server log kept in {workdir})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
