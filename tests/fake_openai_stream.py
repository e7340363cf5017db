"""FAKE OpenAI-compatible streaming server (stdlib http.server) with known timing, for testing the
latency probe's math where a real server's timing is unknown. Not a model: every completion streams
`max_tokens` one-token chunks, the first after `ttft_s`, the rest `itl_s` apart, then a usage chunk.

It also answers /health, /v1/models, /metrics (vLLM's prefix-cache counters: queries += prompt
tokens, hits = 0; spec-decode counters when `spec_rates` is given) and, with dev_mode=True,
POST /reset_prefix_cache. `capacity=N` holds at most N completions at once, the rest waiting for a
slot (a server whose KV cache is full), and /metrics then has vLLM's request gauges (running, waiting,
KV cache usage = running / N). `die_after=N` makes it drop the (N+1)th completion mid-stream and stop
listening, like a server killed mid-probe. `text=""` streams chunks with empty text, as vLLM does
while its detokenizer holds text back (random weights can do that for a whole request).
`sleep_mode=True` adds vLLM's dev-mode sleep endpoints (POST /sleep?level=N, POST /wake_up taking
`wake_s`, GET /is_sleeping); a completion sent while asleep is refused with 503.

    with FakeOpenAIStream(model="tiny", ttft_s=0.05, itl_s=0.01) as fake:
        requests.post(fake.url + "/v1/completions", json={...}, stream=True)
"""
from __future__ import annotations

import json
import socket
import threading
import time
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """Clients hanging up (and die_after's cut streams) are expected; real bugs still print."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
            super().handle_error(request, client_address)


class FakeOpenAIStream:
    def __init__(self, model: str, ttft_s: float = 0.05, itl_s: float = 0.01, dev_mode: bool = False,
                 die_after: int | None = None, spec_rates: list | None = None, text: str = " tok",
                 capacity: int | None = None, sleep_mode: bool = False, wake_s: float = 0.0,
                 fail_after_first: bool = False):
        self.model, self.ttft_s, self.itl_s, self.dev_mode, self.text = model, ttft_s, itl_s, dev_mode, text
        self.die_after, self.spec_rates = die_after, spec_rates
        self.completions = 0
        self.resets = 0
        self.counters = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
        self.lock = threading.Lock()
        self.capacity, self.running, self.waiting = capacity, 0, 0
        self.slots = threading.Condition()
        self.httpd = _QuietServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.dead = False
        self.sleep_mode, self.wake_s, self.asleep, self.sleeps, self.wakes = sleep_mode, wake_s, False, [], 0
        # After a wake, a stream gives its first token, then vLLM's streamed error and [DONE]: what a completion
        # gets when the engine dies under it.
        self.fail_after_first, self.engine_dead = fail_after_first, False

    def _metrics_text(self) -> str:
        lines = [f'{k}{{model_name="{self.model}",engine="0"}} {v}' for k, v in self.counters.items()]
        if self.spec_rates:
            # Per request: one draft of len(rates) tokens per output token step, accepted at the given rates.
            n = self.completions
            lines += [f'vllm:spec_decode_num_drafts_total{{model_name="{self.model}"}} {100 * n}',
                      f'vllm:spec_decode_num_draft_tokens_total{{model_name="{self.model}"}} {100 * n * len(self.spec_rates)}',
                      f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{self.model}"}} {100 * n * sum(self.spec_rates)}']
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{self.model}",position="{i}"}} '
                      f'{100 * n * r}' for i, r in enumerate(self.spec_rates)]
        if self.capacity:
            lines += [f'vllm:num_requests_running{{model_name="{self.model}",engine="0"}} {self.running}',
                      f'vllm:num_requests_waiting{{model_name="{self.model}",engine="0"}} {self.waiting}',
                      f'vllm:kv_cache_usage_perc{{model_name="{self.model}",engine="0"}} {self.running / self.capacity}']
        return "# HELP fake counters\n" + "\n".join(lines) + "\n"

    def _handler(self):
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                # Small SSE writes must leave at once (Nagle + delayed ACK would add ~40 ms).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *a):
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": fake.model}]}).encode())
                elif self.path == "/is_sleeping" and fake.sleep_mode:
                    self._send(200, json.dumps({"is_sleeping": fake.asleep}).encode())
                elif self.path == "/metrics":
                    with fake.lock:
                        self._send(200, fake._metrics_text().encode(), "text/plain")
                else:
                    self._send(404, b"{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/reset_prefix_cache" and fake.dev_mode:
                    fake.resets += 1
                    return self._send(200, b"")
                if fake.sleep_mode and self.path.startswith("/sleep"):
                    fake.asleep = True
                    fake.sleeps.append(self.path.partition("level=")[2] or "1")
                    return self._send(200, b"")
                if fake.sleep_mode and self.path == "/wake_up":
                    time.sleep(fake.wake_s)
                    fake.asleep, fake.wakes = False, fake.wakes + 1
                    fake.engine_dead = fake.fail_after_first
                    return self._send(200, b"")
                if self.path != "/v1/completions":
                    return self._send(404, b'{"detail":"Not Found"}')
                if fake.asleep:
                    return self._send(503, b'{"error":"the engine is asleep"}')
                with fake.lock:
                    fake.completions += 1
                    n = fake.completions
                    fake.counters["vllm:prefix_cache_queries_total"] += len(body["prompt"])
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(obj):
                    data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

                if fake.capacity:
                    with fake.slots:
                        fake.waiting += 1
                        fake.slots.wait_for(lambda: fake.running < fake.capacity)
                        fake.waiting -= 1
                        fake.running += 1
                try:
                    self._stream(body, n, chunk)
                finally:
                    if fake.capacity:
                        with fake.slots:
                            fake.running -= 1
                            fake.slots.notify()

            def _stream(self, body, n, chunk):
                t0 = time.perf_counter()
                for i in range(body["max_tokens"]):
                    if fake.die_after is not None and n > fake.die_after and i == 1:
                        fake.kill()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    # Sleep to an absolute deadline so jitter does not accumulate over tokens.
                    time.sleep(max(0.0, t0 + fake.ttft_s + i * fake.itl_s - time.perf_counter()))
                    if fake.engine_dead and i == 1:
                        chunk({"error": {"message": "EngineCore encountered an issue. See stack trace (above) for "
                                                    "the root cause.", "type": "BadRequestError", "param": None,
                                         "code": 400}})
                        break
                    last = i == body["max_tokens"] - 1  # vLLM: the last token's chunk carries the finish_reason
                    chunk({"choices": [{"index": 0, "text": fake.text, "finish_reason": "length" if last else None}]})
                else:
                    chunk({"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                                    "completion_tokens": body["max_tokens"]}})
                chunk(b"[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return H

    def kill(self):
        """Stop listening (from any thread); in-flight streams are cut by their handlers."""
        if not self.dead:
            self.dead = True
            threading.Thread(target=lambda: (self.httpd.shutdown(), self.httpd.server_close()), daemon=True).start()

    def __enter__(self):
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if not self.dead:
            self.dead = True
            self.httpd.shutdown()
            self.httpd.server_close()
