"""An OpenAI-compatible model on loopback for tests: it answers each chat
with the next of its scripted answers (the last one again and again) and
keeps the requests it was sent."""

from __future__ import annotations

import http.server
import json
import threading
import time


def completion(content: str, number: int = 0) -> bytes:
    """An OpenAI chat completion answering `content` (9 tokens in, 4 out)."""
    return json.dumps({
        "id": f"c{number}", "object": "chat.completion", "model": "stub-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
    }).encode()


class StubModel:
    def __init__(self, answers: list[str], host: str = "127.0.0.1") -> None:
        """A model answering on ``host`` (another address than loopback
        lets nodes in network namespaces of their own reach it)."""
        self.answers = answers
        self.requests: list[dict] = []
        #: When each request came (the Unix time).
        self.times: list[float] = []
        self.lock = threading.Lock()
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                answer = model.answer(self.path, self.headers, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{host}:{self.server.server_address[1]}"

    def answer(self, path: str, headers, body: bytes) -> bytes:
        """The answer to a POST: a chat's next scripted completion (a stub
        that serves more than chats overrides this)."""
        request = json.loads(body)
        with self.lock:
            chats = len(self.requests)
            self.requests.append(request)
            self.times.append(time.time())
        content = self.answers[min(chats, len(self.answers) - 1)]
        return completion(content, chats)

    def config(self) -> str:
        """The kernel's [llm] section for this model."""
        return (f'[llm]\nprovider = "openai"\nbase_url = "{self.url}/v1"\n'
                f'api_key = "sk-test"\nmodel = "stub-model"\n')

    def close(self) -> None:
        self.server.shutdown()
