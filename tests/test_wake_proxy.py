"""Issue 32: a standby woken by its first request (scripts/kit/wake_proxy.py, the front door `make serve
STANDBY=1` puts on PORT). vLLM's sleep mode needs a CUDA GPU, so the server behind the real proxy is the
FAKE one with vLLM's dev-mode sleep endpoints (a completion sent while asleep gets 503, as the fake's
docstring says); the proxy itself, its HTTP and its streaming are real."""
from __future__ import annotations

import json
import threading

import pytest
import requests

from scripts.kit.errors import KitError
from scripts.kit.procs import free_port
from scripts.kit.wake_proxy import WakeProxy
from tests.fake_openai_stream import FakeOpenAIStream


def complete(url: str, n: int = 5) -> list[str]:
    with requests.post(url + "/v1/completions", stream=True, timeout=60, json={
            "model": "tiny", "prompt": [1, 2, 3], "max_tokens": n, "stream": True}) as r:
        assert r.status_code == 200, r.text
        return [json.loads(line[6:])["choices"][0]["text"] for line in r.iter_lines()
                if line.startswith(b"data: {") and json.loads(line[6:])["choices"]]


@pytest.fixture
def asleep():
    with FakeOpenAIStream("tiny", ttft_s=0.01, itl_s=0.002, sleep_mode=True, wake_s=0.2) as fake:
        assert requests.post(fake.url + "/sleep?level=1", timeout=10).status_code == 200
        proxy = WakeProxy(fake.url, "127.0.0.1", free_port()).start()
        try:
            yield fake, proxy
        finally:
            proxy.stop()


def test_the_first_request_wakes_the_server_and_streams_through_fake_sleep_server(asleep):
    fake, proxy = asleep
    assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
    assert fake.wakes == 0  # only /v1/ wakes it
    assert complete(proxy.url) == [" tok"] * 5
    assert fake.wakes == 1 and not fake.asleep
    assert len(proxy.wakes) == 1 and proxy.wakes[0]["wake_s"] >= 0.2
    assert complete(proxy.url, 3) == [" tok"] * 3 and fake.wakes == 1  # awake: no second wake


def test_concurrent_first_requests_share_one_wake_fake_sleep_server(asleep):
    fake, proxy = asleep
    got, errors = [], []

    def one():
        try:
            got.append(complete(proxy.url))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(got) == 4 and fake.wakes == 1


def test_sleep_through_the_proxy_or_behind_its_back_is_followed_fake_sleep_server(asleep):
    fake, proxy = asleep
    complete(proxy.url)
    assert requests.post(proxy.url + "/sleep?level=1", timeout=10).status_code == 200 and fake.asleep
    complete(proxy.url)
    assert fake.wakes == 2
    # straight to vLLM: the proxy still thinks it awake, gets a 503, wakes it and sends the request again
    assert requests.post(fake.url + "/sleep?level=1", timeout=10).status_code == 200
    assert complete(proxy.url) == [" tok"] * 5 and fake.wakes == 3
    # a call still wakes it, and the proxy knows
    requests.post(proxy.url + "/sleep?level=1", timeout=10)
    assert requests.post(proxy.url + "/wake_up", timeout=10).status_code == 200 and fake.wakes == 4
    complete(proxy.url)
    assert fake.wakes == 4


def test_a_dead_server_behind_the_proxy_is_a_502_naming_it(asleep):
    fake, proxy = asleep
    fake.kill()
    r = requests.post(proxy.url + "/v1/completions", json={"model": "tiny", "prompt": [1], "max_tokens": 1}, timeout=30)
    assert r.status_code == 502 and "standby proxy" in r.json()["error"]


def test_a_busy_port_is_refused_naming_it():
    with FakeOpenAIStream("tiny", sleep_mode=True) as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        with pytest.raises(KitError, match=rf"cannot listen on 127.0.0.1:{port} \(PORT\)"):
            WakeProxy(fake.url, "127.0.0.1", port).start()


def test_the_stream_is_passed_on_as_it_comes_not_buffered_fake_sleep_server():
    """Tokens 0.3 s apart: the first must reach the client long before the last is sent."""
    import time
    from scripts.kit.procs import first_token_at
    with FakeOpenAIStream("tiny", ttft_s=0.01, itl_s=0.3, sleep_mode=True) as fake:
        proxy = WakeProxy(fake.url, "127.0.0.1", free_port()).start()
        try:
            t = time.monotonic()
            at = first_token_at(proxy.url, "tiny", [1, 2, 3])  # 4 tokens: the stream ends ~0.9 s after the first
            assert at is not None and at - t < 0.6
        finally:
            proxy.stop()
