"""The front door of a standby server (issue 32): woken by its first request, not only by a call.

`make serve ... STANDBY=1` puts vLLM on a private port and this proxy on the variant's PORT. Every
request is passed through as it is (status, headers, streamed body). A request under /v1/ that finds
the server asleep first sends POST /wake_up and is forwarded once the wake returns; requests that
arrive during a wake wait for that one wake. POST /wake_up and /sleep sent to the proxy reach vLLM
too, so "wake on a call" works as before, and the proxy follows the state they set.

Whether the server sleeps is asked (GET /is_sleeping) only while the proxy does not know: at start,
after a /sleep passed through, and on a 503 from vLLM (put to sleep behind the proxy's back: the request
is then sent again after a wake).

    proxy = WakeProxy("http://127.0.0.1:41234", "127.0.0.1", 8000).start()   # a thread of its own
    proxy.wakes    # [{"at": epoch, "wake_s": ...}, ...]
    proxy.stop()
"""
from __future__ import annotations

import asyncio
import threading
import time

from .errors import KitError

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones aiohttp recomputes for the streamed body.
_DROP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
         "transfer-encoding", "upgrade", "host", "content-length"}


class WakeProxy:
    def __init__(self, upstream: str, host: str, port: int, wake_timeout_s: float = 300.0):
        self.upstream, self.host, self.port, self.wake_timeout_s = upstream.rstrip("/"), host, port, wake_timeout_s
        self.awake: bool | None = None  # None: not known, ask the server
        self.wakes: list[dict] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- the event loop's side -------------------------------------------------------------------
    async def _ensure_awake(self) -> None:
        async with self._lock:  # concurrent first requests: one wake
            if self.awake:
                return
            async with self._session.get(self.upstream + "/is_sleeping") as r:
                asleep = r.status == 200 and (await r.json(content_type=None)).get("is_sleeping")
            if asleep:
                t = time.monotonic()
                async with self._session.post(self.upstream + "/wake_up") as r:
                    if r.status != 200:
                        raise KitError(f"wake_up answered {r.status}: {(await r.text())[:200]}")
                self.wakes.append({"at": time.time(), "wake_s": round(time.monotonic() - t, 3)})
            self.awake = True

    async def _handle(self, request):
        from aiohttp import web
        path = request.rel_url.path
        if path.startswith("/v1/"):
            try:
                await self._ensure_awake()
            except Exception as e:  # the client gets a reason, not a hung connection
                return web.json_response({"error": f"standby proxy could not wake the server: {e}"}, status=502)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}

        async def send():
            return await self._session.request(request.method, self.upstream + str(request.rel_url), data=body,
                                               headers=headers, allow_redirects=False)
        try:
            up = await send()
            if path.startswith("/v1/") and up.status == 503 and self.awake:
                # Put to sleep behind the proxy's back (POST /sleep straight to vLLM): ask, wake, send once more.
                up.release()
                self.awake = None
                await self._ensure_awake()
                up = await send()
        except Exception as e:
            return web.json_response({"error": f"standby proxy: the server did not answer: {e}"}, status=502)
        try:
            if path.startswith("/sleep") and up.status == 200:
                self.awake = False
            elif path == "/wake_up" and up.status == 200:
                self.awake = True
            out = web.StreamResponse(status=up.status, reason=up.reason,
                                     headers={k: v for k, v in up.headers.items() if k.lower() not in _DROP})
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
        finally:
            up.release()

    async def _serve(self) -> None:
        import aiohttp
        from aiohttp import web
        self._lock = asyncio.Lock()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10,
                                                                            sock_read=self.wake_timeout_s))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def _close(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    # -- the caller's side -----------------------------------------------------------------------
    def start(self) -> "WakeProxy":
        """Listen in a daemon thread; returns once the port is bound (KitError naming it if it is not)."""
        def run():
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self._serve())
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                self._error = e
                if getattr(self, "_runner", None) is not None:
                    self._loop.run_until_complete(self._runner.cleanup())
                if getattr(self, "_session", None) is not None:
                    self._loop.run_until_complete(self._session.close())
                self._loop.close()
                self._ready.set()
                return
            self._ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._close())
            self._loop.close()
        self._thread = threading.Thread(target=run, name="standby-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise KitError(f"standby proxy: cannot listen on {self.host}:{self.port} (PORT): {self._error}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
