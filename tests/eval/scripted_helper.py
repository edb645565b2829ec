"""A TEST-ONLY chat helper speaking the board helper's JSON-lines protocol (hexstudio/workers/board/genie_session.py)
that answers from a script instead of a model: the built-in toy model never writes a tool call, so the serve
test's tool-call request is answered by this helper the way a tool-calling model answers. It runs no model.

    python scripted_helper.py SCRIPT_JSON      # {"substring of the prompt": "reply", ...}; else "OK."

A reply "<die>" sends two pieces of text, then the helper exits with status 139 mid-reply; "<refuse>" ends the
query as failed, with the profile of an earlier query (what Genie's profile holds after a refused one);
"<refuse:WHY>" ends it as failed
with WHY as the end's message; "<refuse-continuation>" refuses a query on a dialog that answered one since its last reset (a full KV cache);
"<full>" sends some text, then ends the query with a full context; "<too-long>" ends it with a full context and no
text (the prompt alone fills it); "<then-reset-fails>" answers "OK.", and the next reset fails (Genie status -1).
"""

from __future__ import annotations

import json
import os
import sys
import time

# Genie's profile as it stands after one earlier query: what a refused query's end carries
EARLIER = {
    "header": {
        "header_version": {"major": 0, "minor": 1, "patch": 0},
        "version": {"major": 0, "minor": 1, "patch": 0},
        "artifact_type": "GENIE_PROFILE",
    },
    "components": [
        {
            "name": "dialog0",
            "type": "dialog",
            "events": [
                {
                    "type": "GenieDialog_create",
                    "duration": 50000,
                    "init-time": {"value": 50000, "unit": "us"},
                },
                {
                    "type": "GenieDialog_query",
                    "duration": 9000,
                    "num-prompt-tokens": {"value": 6, "unit": ""},
                    "prompt-processing-rate": {"value": 600.0, "unit": "toks/sec"},
                    "time-to-first-token": {"value": 1074, "unit": "us"},
                    "num-generated-tokens": {"value": 8, "unit": ""},
                    "token-generation-rate": {"value": 900.0, "unit": "toks/sec"},
                    "token-generation-time": {"value": 8000, "unit": "us"},
                },
            ],
        }
    ],
}


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    script = json.loads(sys.argv[1])
    emit(
        {
            "event": "ready",
            "genie_version": "scripted",
            "init_ms": 50.0,
            "simulated": True,
            "context_length": 4096,
        }
    )
    since_reset = 0
    reset_fails = False
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "quit":
            return 0
        if op == "reset":
            since_reset = 0
            emit({"event": "reset", "status": -1} if reset_fails else {"event": "reset"})
        elif op == "sampler":
            emit({"event": "sampler", "applied": True})
        elif op == "query":
            reply = next((r for k, r in script.items() if k in msg["prompt"]), "OK.")
            if reply == "<refuse-continuation>":
                # the KV cache is "full": a query on a dialog that answered one since its last reset is refused
                if since_reset:
                    emit(
                        {"event": "end", "id": msg["id"], "state": "failed", "status": -8, "profile": EARLIER}
                    )
                    continue
                reply = "OK."
            since_reset += 1
            if reply == "<then-reset-fails>":
                reply, reset_fails = "OK.", True
            if reply == "<too-long>":
                emit({"event": "end", "id": msg["id"], "state": "context_full", "status": 0, "profile": None})
                continue
            if reply.startswith("<refuse:"):
                # a query the runtime fails with its own reason (GenieX's generate() raising): the end carries it
                why = reply[len("<refuse:") : -1]
                emit({"event": "end", "id": msg["id"], "state": "failed", "status": 1, "message": why})
                continue
            if reply == "<refuse>":
                # a query the dialog refuses (GenieDialog_query status -8): Genie's profile holds only the
                # query before, which the helper sends with every end
                emit({"event": "end", "id": msg["id"], "state": "failed", "status": -8, "profile": EARLIER})
                continue
            if reply == "<full>":
                # the KV cache filled up during the reply: some text, then the end says so
                emit({"event": "text", "id": msg["id"], "text": "Cut sh", "tokens": 2})
                emit({"event": "end", "id": msg["id"], "state": "context_full", "status": 0, "profile": None})
                continue
            if reply == "<die>":
                # a helper that crashes mid-reply (a segfault in the runtime, the board's OOM killer)
                for piece in ("Half", " a rep"):
                    emit({"event": "text", "id": msg["id"], "text": piece, "tokens": 1})
                sys.stdout.flush()
                os._exit(139)
            t0 = time.perf_counter()
            for i in range(0, len(reply), 4):
                emit({"event": "text", "id": msg["id"], "text": reply[i : i + 4], "tokens": 1})
            ms = (time.perf_counter() - t0) * 1000
            n = (len(reply) + 3) // 4
            emit(
                {
                    "event": "end",
                    "id": msg["id"],
                    "state": "complete",
                    "status": 0,
                    "measured": {"callbacks": n, "ttft_ms": 1.0, "gen_ms": max(ms, 0.001)},
                }
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
