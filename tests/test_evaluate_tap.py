"""The gates' pass-through (scripts/evaluate.py FinishTap) over real HTTP: a stdlib server stands in for
vLLM's OpenAI endpoint (the tap only forwards bytes), then goes away as a dead server does."""
from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request

import pytest

from scripts import evaluate
from scripts.kit.procs import free_port


class _Upstream(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        out = json.dumps({"object": "list", "data": [{"id": "served-one", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        out = json.dumps({"choices": [{"finish_reason": "length", "text": "x"}], "usage": {"completion_tokens": 7},
                          "seen": body}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def _post(url: str, payload: dict):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def upstream():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Upstream)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_tap_forwards_and_counts_then_answers_502_naming_a_gone_server(upstream):
    up = f"http://127.0.0.1:{upstream.server_address[1]}"
    tap = evaluate.FinishTap(up)
    try:
        tap.reset({"chat_template_kwargs": {"enable_thinking": False}})
        code, out = _post(tap.url + "/v1/chat/completions", {"messages": []})
        assert code == 200 and out["seen"]["chat_template_kwargs"] == {"enable_thinking": False}
        assert tap.finish == ["length"] and tap.completion_tokens == [7] and tap.failed == []

        upstream.shutdown()
        upstream.server_close()
        code, out = _post(tap.url + "/v1/completions", {"prompt": "x"})
        # Before: the handler raised and lm-eval saw only aiohttp's "Server disconnected".
        assert code == 502 and out["error"]["type"] == "upstream_unreachable"
        assert up in out["error"]["message"] and "ConnectionError" in out["error"]["message"]
        assert len(tap.failed) == 1 and tap.failed[0].startswith("POST /v1/completions: ConnectionError")
        assert tap.finish == ["length"]  # nothing counted for a request that got no answer
        tap.reset({})
        assert tap.failed == []
    finally:
        tap.shutdown()


def test_unanswered_names_the_gate_the_url_and_the_first_failure():
    msg = evaluate.unanswered("ifeval", "http://h:1", ["POST /v1/chat/completions: ConnectionError: refused", "b"], None)
    assert msg.startswith("gate ifeval: the server at http://h:1 stopped answering (2 request(s) got no reply; "
                          "first: POST /v1/chat/completions: ConnectionError: refused); no record written")
    assert "--url" in msg


class _EngineDeadUpstream(_Upstream):
    """Answers every completion as vLLM's API server does once its engine has died under it: 500, its error JSON."""
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        out = json.dumps({"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the "
                                               "root cause.", "type": "InternalServerError", "code": 500}}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def test_tap_passes_a_server_error_through_and_keeps_what_it_said():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _EngineDeadUpstream)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    tap = evaluate.FinishTap(f"http://127.0.0.1:{srv.server_address[1]}")
    try:
        code, out = _post(tap.url + "/v1/completions", {"prompt": "x"})
        assert code == 500 and out["error"]["type"] == "InternalServerError"  # the answer, byte for byte
        assert tap.errors == ["POST /v1/completions: HTTP 500: EngineCore encountered an issue. See stack trace "
                              "(above) for the root cause."]
        assert tap.failed == [] and tap.finish == []
        tap.reset({})
        assert tap.errors == []
    finally:
        tap.shutdown()
        srv.shutdown()
        srv.server_close()


def test_unanswered_names_a_server_error_when_every_request_got_an_answer():
    msg = evaluate.unanswered("ifeval", "http://h:1", [], None, ["POST /v1/completions: HTTP 500: dead", "b", "c"])
    assert msg.startswith("gate ifeval: the server at http://h:1 answered 3 request(s) with a server error (first: "
                          "POST /v1/completions: HTTP 500: dead); no record written")


def test_check_url_takes_the_served_model_and_refuses_another_or_none(upstream):
    up = f"http://127.0.0.1:{upstream.server_address[1]}"
    evaluate.check_url(up + "/", "served-one")
    with pytest.raises(evaluate.KitError, match=r"serves \['served-one'\], not variant 'tiny' \(gate the right"):
        evaluate.check_url(up, "tiny")
    upstream.shutdown()
    upstream.server_close()
    with pytest.raises(evaluate.KitError, match=rf"^--url {up}: no OpenAI server answers GET /v1/models \(ConnectionError"):
        evaluate.check_url(up, "served-one")


class _BigSlowUpstream(http.server.BaseHTTPRequestHandler):
    """Answers a completion late and large, so the tap's reply meets a client that has already hung up."""
    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        import time
        time.sleep(0.5)
        out = json.dumps({"choices": [{"finish_reason": "length", "text": "x" * 8_000_000}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def test_a_client_that_hangs_up_mid_answer_prints_no_traceback_banner(capfd):
    """lm-eval cancels its requests when a gate stops (a dead server, a failed task); the tap then writes to a closed
    connection. That is the client's choice, not the tap's error: no socketserver banner on the user's stderr."""
    import socket
    import time
    up = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _BigSlowUpstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    tap = evaluate.FinishTap(f"http://127.0.0.1:{up.server_address[1]}")
    try:
        body = json.dumps({"model": "m", "prompt": "p"}).encode()
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", tap.server_address[1]))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
            s.close()
        time.sleep(1.5)  # the tap's handlers answer after the upstream's 0.5 s, into closed sockets
    finally:
        tap.shutdown()
        up.shutdown()
    assert "Exception occurred during processing of request" not in capfd.readouterr().err
