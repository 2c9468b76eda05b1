"""A real OpenAI-compatible chat-completions server on 127.0.0.1, for tests (never a mock object).

You give it a function from the request JSON to a reply; the reply is the assistant text (a `str`) or a
`Reply` that injects a fault: an HTTP error status (429 with Retry-After, 500, ...), a delay past the
client's timeout, a garbage body, or no answer at all (the connection closed). `Flaky` answers each distinct
prompt with a scripted list of faults before the real answer, which is what retry tests need.

    from chat_server import ChatServer, Flaky, Reply, last_user_text   # tests/ is on sys.path under pytest

    with ChatServer(lambda req: "respond") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x")
        ...
        server.requests  # every request body received, in arrival order

    faults = [Reply.error(429, retry_after=0), Reply.error(500), Reply.slow(5.0), Reply.garbage()]
    ChatServer(Flaky(lambda req: last_user_text(req).upper(), faults))
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    """What the server sends: a completion carrying `text`, or an injected fault."""

    text: str | None = None
    status: int = 200
    delay: float = 0.0  # seconds to wait before answering (longer than the client timeout = a timeout)
    body: bytes | None = None  # sent verbatim instead of a completion (garbage)
    headers: dict = field(default_factory=dict)
    hang_up: bool = False  # close the connection without answering, as a server killed mid-request does

    @classmethod
    def error(cls, status: int, retry_after: float | None = None) -> Reply:
        headers = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
        body = json.dumps({"error": {"message": f"injected HTTP {status}", "type": "server_error", "code": status}})
        return cls(status=status, body=body.encode(), headers=headers)

    @classmethod
    def slow(cls, seconds: float, text: str = "too late") -> Reply:
        return cls(text=text, delay=seconds)

    @classmethod
    def garbage(cls, body: bytes = b"<html>502 Bad Gateway, but with status 200</html>") -> Reply:
        return cls(body=body)

    @classmethod
    def hung_up(cls) -> Reply:
        return cls(hang_up=True)

    @classmethod
    def no_choices(cls) -> Reply:
        return cls(body=json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m"}).encode())


def last_user_text(request: dict) -> str:
    """The text parts of the last user message, joined by newlines."""
    for message in reversed(request.get("messages", [])):
        if message.get("role") == "user":
            content = message["content"]
            if isinstance(content, str):
                return content
            return "\n".join(p["text"] for p in content if p.get("type") == "text")
    return ""


def image_urls(request: dict) -> list[str]:
    """The image URLs of every message, in order."""
    urls = []
    for message in request.get("messages", []):
        if isinstance(message.get("content"), list):
            urls += [p["image_url"]["url"] for p in message["content"] if p.get("type") == "image_url"]
    return urls


class Flaky:
    """Answer each distinct key (default: the last user text) with `faults` in order first, then `answer`.

    Thread-safe, and it records how many calls each key took, so a test can check every fault was met.
    """

    def __init__(self, answer: Callable[[dict], str | Reply], faults: list[Reply],
                 key: Callable[[dict], str] = last_user_text):
        self.answer, self.faults, self.key = answer, list(faults), key
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, request: dict) -> str | Reply:
        key = self.key(request)
        with self._lock:
            n = self.calls.get(key, 0)
            self.calls[key] = n + 1
        return self.faults[n] if n < len(self.faults) else self.answer(request)


def completion(text: str, model: str) -> dict:
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                     "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class ChatServer:
    """`POST /v1/chat/completions` (and `GET /v1/models`) served from a background thread."""

    def __init__(self, reply: Callable[[dict], str | Reply], model: str = "test-model", port: int = 0):
        self.reply, self.model = reply, model
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): fine
                    pass

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": server.model, "object": "model", "created": 0, "owned_by": "test"}]}).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                try:
                    request = json.loads(self.rfile.read(length))
                except json.JSONDecodeError:
                    self._send(400, b'{"error": {"message": "request body is not JSON"}}')
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                with server._lock:
                    server.requests.append(request)
                try:
                    reply = server.reply(request)
                except Exception as err:  # noqa: BLE001 - a bug in the reply function shows up as a 500
                    self._send(500, json.dumps({"error": {"message": repr(err)}}).encode())
                    return
                if isinstance(reply, str):
                    reply = Reply(text=reply)
                if reply.hang_up:
                    self.close_connection = True
                    return
                if reply.delay:
                    time.sleep(reply.delay)
                body = reply.body
                if body is None:
                    body = json.dumps(completion(reply.text, request.get("model", server.model))).encode()
                self._send(reply.status, body, reply.headers)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # port: a server restarted where it was
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
