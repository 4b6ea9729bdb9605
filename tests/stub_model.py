"""An OpenAI-compatible model on loopback for tests: it answers each chat
with the next of its scripted answers (the last one again and again) and
keeps the requests it was sent."""

from __future__ import annotations

import http.server
import json
import threading



def completion(content: str, number: int = 0) -> bytes:
    """An OpenAI chat completion answering `content` (9 tokens in, 4 out)."""
    return json.dumps({
        "id": f"c{number}", "object": "chat.completion", "model": "stub-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
    }).encode()

class StubModel:
    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.requests: list[dict] = []
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                chats = len(model.requests)
                model.requests.append(request)
                content = model.answers[min(chats, len(model.answers) - 1)]
                answer = completion(content, chats)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def config(self) -> str:
        """The kernel's [llm] section for this model."""
        port = self.server.server_address[1]
        return (f'[llm]\nprovider = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
                f'api_key = "sk-test"\nmodel = "stub-model"\n')

    def close(self) -> None:
        self.server.shutdown()
