"""traces.http_pool against real aiohttp servers: keep-alive reuse, connections opened ahead of need, answers
ended by Connection: close, a bad answer failing its request only, the limit honoured."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from traces.http_pool import ConnectionPool, Response, ResponseError, request_bytes


class _Server:
    """An aiohttp server counting the connections it accepted."""

    def __init__(self, handler):
        self.handler, self.peers = handler, set()

    async def __aenter__(self):
        async def counted(request):
            self.peers.add(request.transport.get_extra_info("peername"))
            return await self.handler(request)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", counted)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


async def _ask(pool: ConnectionPool, body: bytes = b"{}", path: str = "/echo") -> Response:
    conn = await pool.acquire()
    answer = Response(asyncio.get_running_loop())
    conn.send(request_bytes("POST", path, pool.authority, body), answer)
    await answer.done
    return answer


async def _chunked(request):
    resp = web.StreamResponse()
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    data = await request.read()
    for i in range(0, len(data), 3):
        await resp.write(data[i:i + 3])
    await resp.write_eof()
    return resp


def test_keep_alive_reuses_one_connection_and_reads_chunked_bodies():
    async def body():
        async with _Server(_chunked) as server:
            pool = ConnectionPool(server.url, limit=4)
            try:
                answers = [await _ask(pool, f'{{"n": {i}}}'.encode()) for i in range(5)]
            finally:
                await pool.close()
            return answers, server.peers
    answers, peers = asyncio.run(body())
    assert [a.status for a in answers] == [200] * 5
    assert [a.body() for a in answers] == [f'{{"n": {i}}}'.encode() for i in range(5)]
    assert len(peers) == 1  # one after the other: the same keep-alive connection


def test_spare_connections_are_opened_ahead_of_the_requests_that_take_them():
    async def handler(request):
        return web.Response(text="ok")

    async def body():
        async with _Server(handler) as server:
            pool = ConnectionPool(server.url, limit=10, spare=3)
            try:
                await pool.warm(3)
                assert pool.size == 3
                conns = [pool.take() for _ in range(3)]  # every warm one taken, none answered yet
                assert all(c is not None for c in conns)
                for _ in range(200):  # the pool refills in the background, no request waiting
                    if len(pool._idle) == 3:  # noqa: SLF001
                        break
                    await asyncio.sleep(0.01)
                idle_after_refill = len(pool._idle)  # noqa: SLF001
                size = pool.size
            finally:
                await pool.close()
            return idle_after_refill, size
    idle, size = asyncio.run(body())
    assert idle == 3 and size == 6


def test_each_expected_request_gets_a_connection_opened_before_it_asks():
    async def handler(request):
        return web.Response(text="ok")

    async def body():
        async with _Server(handler) as server:
            pool = ConnectionPool(server.url, limit=10, spare=0)
            try:
                for _ in range(3):
                    pool.expect()
                assert pool.size == 3  # opening for them now, nobody asked yet
                for _ in range(200):
                    if len(pool._idle) == 3:  # noqa: SLF001
                        break
                    await asyncio.sleep(0.01)
                conns = [pool.take(expected=True) for _ in range(3)]
                await asyncio.sleep(0.05)  # a top-up, were one due, would be under way by now
                return conns, pool.size
            finally:
                await pool.close()
    conns, size = asyncio.run(body())
    assert all(c is not None for c in conns) and len(set(conns)) == 3
    assert size == 3  # no spare asked for: the three announced requests took their own, nothing more opened


def test_connection_close_answers_are_not_reused_and_the_limit_holds():
    async def handler(request):
        await asyncio.sleep(0.05)
        return web.Response(text="bye", headers={"Connection": "close"})

    async def body():
        async with _Server(handler) as server:
            pool = ConnectionPool(server.url, limit=2)
            try:
                answers = await asyncio.gather(*(_ask(pool) for _ in range(6)))
                most = pool.size
            finally:
                await pool.close()
            return answers, server.peers, most
    answers, peers, most = asyncio.run(body())
    assert [a.body() for a in answers] == [b"bye"] * 6
    assert len(peers) == 6  # each answer closed its connection: a new one per request
    assert most <= 2


def test_a_bad_answer_fails_its_request_only():
    async def handler(request):
        if request.path == "/bad":  # a status line HTTP does not allow, then the connection stays open
            request.transport.write(b"HTTP/1.1 2OO Fine\r\nContent-Length: 0\r\n\r\n")
            await asyncio.sleep(0.2)
            return web.Response()
        return web.Response(text="fine")

    async def body():
        async with _Server(handler) as server:
            pool = ConnectionPool(server.url, limit=2)
            try:
                with pytest.raises(ResponseError, match="bad HTTP response"):
                    await _ask(pool, path="/bad")
                return await _ask(pool, path="/good")
            finally:
                await pool.close()
    assert asyncio.run(body()).body() == b"fine"


def test_pool_refuses_urls_it_cannot_open():
    async def body():
        with pytest.raises(ValueError, match="http"):
            ConnectionPool("ftp://127.0.0.1:21", limit=1)
    asyncio.run(body())
