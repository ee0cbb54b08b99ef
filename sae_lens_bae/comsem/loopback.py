"""A small OpenAI-compatible server on loopback with rule-based answers, for tests, benchmarks
and dry runs of ComSem without a real LLM.

It speaks the parts of the API ComSem uses (``/v1/chat/completions``, ``/v1/files``,
``/v1/batches``) and answers deterministically: the explainer gets ``the word "X"`` with X the
marked token most common in its records; the judge answers Yes exactly when the marked token
appears in the description. Faults can be injected (HTTP 429/500 on the first requests, invalid
replies, latency, holding replies back), and every request is logged, so a test can check what the
real ``openai`` client sent and how often.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import hashlib
import json
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LoopbackServer"]

_MARKED = re.compile(r"<<(.*?)>>(?!>)", re.S)


def _key(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class LoopbackServer:
    """``with LoopbackServer() as server: ... server.base_url ...``

    Args:
        latency: seconds every chat completion takes.
        faults: HTTP status codes (429, 500, ...) answered to the first ``len(faults)`` chat
            requests, in order; the client is expected to retry them.
        invalid_every: every request whose prompt hash is divisible by this gets an unusable
            reply ("Maybe" for the judge, a two-line list for the explainer); 0: never.
        hold_after: after this many answered chat requests, hold further ones until
            ``release()`` (to kill a client at a known point).
        responder: replaces the rule-based answers: body -> reply text (e.g. a local model's
            generation, see ``benchmarks/comsem_local_llm.py``); called one request at a time.
    """

    def __init__(
        self,
        latency: float = 0.0,
        faults: Sequence[int] = (),
        invalid_every: int = 0,
        hold_after: int | None = None,
        batch_polls: int = 1,
        responder: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        self.responder = responder
        self._respond_lock = threading.Lock()
        self.latency = latency
        self.faults = list(faults)
        self.invalid_every = invalid_every
        self.hold_after = hold_after
        self.batch_polls = batch_polls
        self.received: list[dict[str, Any]] = []  # every chat body, faults included
        self.answered: list[str] = []  # request keys answered with HTTP 200
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> LoopbackServer:
        handler = type("Handler", (_Handler,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def base_url(self) -> str:
        assert self._server is not None, "use the server as a context manager"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def release(self) -> None:
        """Let held requests through."""
        self._release.set()

    # -- answers ----------------------------------------------------------------------------
    def chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, JSON) for one chat completion body."""
        with self._lock:
            self.received.append(body)
            fault = self.faults.pop(0) if self.faults else None
            held = self.hold_after is not None and len(self.answered) >= self.hold_after
        if fault is not None:
            return fault, {"error": {"message": f"injected {fault}", "type": "injected"}}
        if held:  # answered only after release(), and then as an error: its client may be gone
            self._release.wait()
            return 503, {"error": {"message": "held request released", "type": "held"}}
        if self.latency:
            time.sleep(self.latency)
        completion = self.completion(body)
        with self._lock:
            self.answered.append(_key(body))
        return 200, completion

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        if self.responder is not None:
            with self._respond_lock:
                text, p_yes = self.responder(body), None
        else:
            text, p_yes = self._rule_based(body)
        words = sum(len(str(m.get("content", "")).split()) for m in messages)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
        if body.get("logprobs") and p_yes is not None:
            first = text
            top = [
                {"token": "Yes", "logprob": _log(p_yes), "bytes": None},
                {"token": "No", "logprob": _log(1 - p_yes), "bytes": None},
            ]
            chosen = next((t for t in top if t["token"] == first), top[0])
            choice["logprobs"] = {
                "content": [{**chosen, "token": first, "top_logprobs": top}],
                "refusal": None,
            }
        return {
            "id": "chatcmpl-" + _key(body)[:12],
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "loopback"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": words,
                "completion_tokens": len(text.split()),
                "total_tokens": words + len(text.split()),
            },
        }

    def _rule_based(self, body: dict[str, Any]) -> tuple[str, float | None]:
        """(reply, P(Yes) for the judge's logprobs): see the class docstring."""
        messages = body.get("messages") or []
        last = messages[-1]["content"] if messages else ""
        invalid = self.invalid_every and int(_key(body), 16) % self.invalid_every == 0
        marked = [m.strip().lower() for m in _MARKED.findall(last)]
        if last.startswith("Description:"):  # the judge
            description = last.splitlines()[0].lower()
            if marked:
                fits = bool(marked[0]) and marked[0] in description
                p_yes = 0.9 if fits else 0.2
            else:  # the content-free input: a judge biased towards Yes
                fits, p_yes = True, 0.7
            return ("Maybe" if invalid else ("Yes" if fits else "No")), p_yes
        if invalid:
            return "1. some words\n2. other words", None
        common = Counter(marked).most_common(1)
        return (f'the word "{common[0][0]}"' if common else "nothing"), None

    # -- Batch API --------------------------------------------------------------------------
    def create_batch(self, request: dict[str, Any]) -> dict[str, Any]:
        lines = self.files[request["input_file_id"]].decode().splitlines()
        outputs = []
        for line in filter(str.strip, lines):
            item = json.loads(line)
            outputs.append(
                {
                    "id": "resp-" + item["custom_id"][:8],
                    "custom_id": item["custom_id"],
                    "response": {"status_code": 200, "body": self.completion(item["body"])},
                    "error": None,
                }
            )
        with self._lock:
            output_id = f"file-out-{len(self.files)}"
            self.files[output_id] = "\n".join(json.dumps(o) for o in outputs).encode()
            batch_id = f"batch_{len(self.batches)}"
            self.batches[batch_id] = {
                "id": batch_id,
                "object": "batch",
                "endpoint": request["endpoint"],
                "input_file_id": request["input_file_id"],
                "completion_window": request["completion_window"],
                "created_at": 0,
                "status": "in_progress",
                "output_file_id": None,
                "request_counts": {"total": len(outputs), "completed": 0, "failed": 0},
                "_output": output_id,
                "_polls": 0,
            }
        return self._public(self.batches[batch_id])

    def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            batch = self.batches[batch_id]
            batch["_polls"] += 1
            if batch["_polls"] >= self.batch_polls:
                batch["status"] = "completed"
                batch["output_file_id"] = batch["_output"]
                total = batch["request_counts"]["total"]
                batch["request_counts"]["completed"] = total
        return self._public(batch)

    @staticmethod
    def _public(batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in batch.items() if not k.startswith("_")}


def _log(p: float) -> float:

    return math.log(max(p, 1e-12))


class _Handler(BaseHTTPRequestHandler):
    owner: LoopbackServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict[str, Any] | bytes) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 429:
            self.send_header("Retry-After", "0")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up
            self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_POST(self) -> None:  # noqa: N802
        owner = self.owner
        if self.path == "/v1/chat/completions":
            self._send(*owner.chat(json.loads(self._body())))
        elif self.path == "/v1/files":
            raw = self._body()
            head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
            message = email.message_from_bytes(head + raw, policy=email.policy.HTTP)
            content = b""
            for part in message.iter_parts():
                if part.get_param("name", header="content-disposition") == "file":
                    content = part.get_payload(decode=True) or b""
            file_id = f"file-{len(owner.files)}"
            owner.files[file_id] = content
            self._send(
                200,
                {
                    "id": file_id,
                    "object": "file",
                    "bytes": len(content),
                    "created_at": 0,
                    "filename": "input.jsonl",
                    "purpose": "batch",
                    "status": "processed",
                },
            )
        elif self.path == "/v1/batches":
            self._send(200, owner.create_batch(json.loads(self._body())))
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_GET(self) -> None:  # noqa: N802
        owner = self.owner
        parts = self.path.rstrip("/").split("/")  # "", "v1", "batches", id / "files", id, ...
        if parts[:3] == ["", "v1", "batches"] and len(parts) == 4 and parts[3] in owner.batches:
            self._send(200, owner.retrieve_batch(parts[3]))
        elif (
            parts[:3] == ["", "v1", "files"] and parts[-1] == "content" and parts[-2] in owner.files
        ):
            self._send(200, owner.files[parts[-2]])
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})
