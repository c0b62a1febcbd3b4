#!/usr/bin/env python3
"""One MCP tool call over streamable HTTP, with nothing but Python's standard library.

    scripts/mcp_call.py URL TOKEN TOOL [ARGUMENTS_JSON]

Opens a session (initialize, then notifications/initialized), calls TOOL with the arguments
(default {}), and prints the call's result as one JSON object: the tool's structured content, or
its text, and whether it is an error. The bearer TOKEN is what the server authenticates (the
payments example takes `tenant:subject`). A client that repeats a call sends the same arguments
again; the server's idem ledger makes the repeat safe.
"""

import http.client
import json
import sys
import urllib.error
import urllib.request

PROTOCOL = "2025-06-18"


def post(url, token, message, session=None):
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}",
        "MCP-Protocol-Version": PROTOCOL,
    }
    if session:
        headers["Mcp-Session-Id"] = session
    request = urllib.request.Request(url, data=json.dumps(message).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        body = response.read().decode()
        session = response.headers.get("Mcp-Session-Id", session)
    if "id" not in message:
        return None, session
    # A JSON body, or server-sent events whose `data:` lines carry JSON-RPC messages.
    candidates = [body] if body.lstrip().startswith("{") else [
        line[len("data:"):].strip() for line in body.splitlines() if line.startswith("data:")
    ]
    for candidate in candidates:
        if not candidate:
            continue
        answer = json.loads(candidate)
        if answer.get("id") == message["id"]:
            return answer, session
    raise SystemExit(f"no answer to request {message['id']} in: {body!r}")


def main():
    if len(sys.argv) not in (4, 5):
        raise SystemExit(__doc__)
    url, token, tool = sys.argv[1:4]
    arguments = json.loads(sys.argv[4]) if len(sys.argv) == 5 else {}
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "mcp_call.py", "version": "1"},
        },
    }
    _, session = post(url, token, hello)
    post(url, token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    answer, _ = post(url, token, call, session)
    if "error" in answer:
        print(json.dumps({"protocol_error": answer["error"]}))
        return
    result = answer["result"]
    text = "".join(part.get("text", "") for part in result.get("content", []))
    print(json.dumps({
        "is_error": result.get("isError", False),
        "structured": result.get("structuredContent"),
        "text": text,
        "meta": result.get("_meta"),
    }))


if __name__ == "__main__":
    try:
        main()
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError) as error:
        # The server went away mid-call (a killed replica): the client does not know the outcome.
        print(json.dumps({"transport_error": f"{type(error).__name__}: {error}"}))
        sys.exit(1)
