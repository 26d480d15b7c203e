"""The emulated vLLM endpoint against the official `openai` client: chat and completions, streaming and not,
usage, one token per chunk, OpenAI error bodies, and `/metrics` in vLLM's names."""
from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devices.emulated.vllm_server import ServiceModel, VllmEmulator

MODEL = "emulated-llm"


async def _with_client(body, **service):
    import openai  # here, not at the top: ~0.5 CPU-s that every test worker would pay to collect this module

    emulator = VllmEmulator(ServiceModel(prefill_tokens_per_s=1e5, decode_tokens_per_s=2000, max_model_len=4096,
                                         **service), model=MODEL)
    await emulator.start()
    client = openai.AsyncOpenAI(base_url=emulator.url + "/v1", api_key="unused", max_retries=0)
    try:
        return await body(client, emulator)
    finally:
        await client.close()
        await emulator.stop()


def test_chat_and_completions_streaming_and_not():
    async def body(client, em):
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three four"}]
        chat = await client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=7)
        stream = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=9, stream=True,
                                                      stream_options={"include_usage": True})
        chat_chunks = [c async for c in stream]
        text = await client.completions.create(model=MODEL, prompt=[5, 6, 7, 8, 9, 10], max_tokens=4)
        stream = await client.completions.create(model=MODEL, prompt="a b c", max_tokens=5, stream=True)
        text_chunks = [c async for c in stream]
        return chat, chat_chunks, text, text_chunks

    chat, chat_chunks, text, text_chunks = asyncio.run(_with_client(body))
    assert chat.object == "chat.completion" and chat.model == MODEL
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason == "length"
    assert chat.choices[0].message.content.split() == ["t"] * 7
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens) == (6, 7, 13)
    # Streamed chat: a role chunk, then exactly one token per chunk, then the usage-only chunk.
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    tokens = [c for c in chat_chunks if c.choices and c.choices[0].delta.content]
    assert len(tokens) == 9 and all(c.choices[0].delta.content == " t" for c in tokens)
    assert [c.choices[0].finish_reason for c in tokens] == [None] * 8 + ["length"]
    assert chat_chunks[-1].choices == [] and chat_chunks[-1].usage.completion_tokens == 9
    assert chat_chunks[-1].usage.prompt_tokens == 6
    assert all(c.usage is None for c in chat_chunks[:-1])  # include_usage: null on every other chunk
    assert text.object == "text_completion" and text.usage.prompt_tokens == 6 and text.usage.completion_tokens == 4
    assert [c.choices[0].text for c in text_chunks] == [" t"] * 5  # no include_usage: no usage chunk
    assert text_chunks[-1].choices[0].finish_reason == "length"


def test_errors_in_openai_form():
    import openai

    async def body(client, em):
        errors = []
        calls = [
            lambda: client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}]),
            lambda: client.completions.create(model=MODEL, prompt="x", n=2),
            lambda: client.completions.create(model=MODEL, prompt="x", logprobs=2),
            lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                   logprobs=True),
            lambda: client.completions.create(model=MODEL, prompt="x " * 5000, max_tokens=2),
        ]
        for call in calls:
            try:
                await call()
                errors.append(None)
            except openai.APIStatusError as exc:
                errors.append((type(exc).__name__, exc.status_code, exc.body))
        return errors

    errors = asyncio.run(_with_client(body))
    assert [e[:2] for e in errors] == [("NotFoundError", 404)] + [("BadRequestError", 400)] * 4
    assert errors[0][2] == {"message": "The model `no-such-model` does not exist.", "type": "NotFoundError",
                            "param": "model", "code": 404}
    assert [e[2]["param"] for e in errors[1:]] == ["n", "logprobs", "logprobs", "max_tokens"]


def test_metrics_use_vllm_names_and_count_what_was_served():
    async def body(client, em):
        for k in range(3):
            await client.completions.create(model=MODEL, prompt=[1] * (10 + k), max_tokens=5)
        async with aiohttp.ClientSession() as session:
            async with session.get(em.url + "/metrics") as resp:
                return resp.headers["Content-Type"], await resp.text()

    content_type, text = asyncio.run(_with_client(body, time_scale=2.0))
    assert content_type.startswith("text/plain")
    samples = {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("le",)))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples if "le" not in s.labels}
    labels = (("engine", "0"), ("model_name", MODEL))
    assert samples[("vllm:num_requests_running", labels)] == 0
    assert samples[("vllm:num_requests_waiting", labels)] == 0
    assert samples[("vllm:prompt_tokens_total", labels)] == 33
    assert samples[("vllm:generation_tokens_total", labels)] == 15
    assert samples[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "length"), ("model_name", MODEL)))] == 3
    assert samples[("vllm:time_to_first_token_seconds_count", labels)] == 3
    assert samples[("vllm:time_per_output_token_seconds_count", labels)] == 12  # 4 gaps per 5-token request
    # Decode at 2000 tokens/s of model time: each gap is 0.5 ms of model time (1/2000 s), whatever the scale.
    assert samples[("vllm:time_per_output_token_seconds_sum", labels)] == pytest.approx(12 / 2000, rel=1e-3)
    assert samples[("vllm:e2e_request_latency_seconds_count", labels)] == 3
    assert samples[("vllm:request_queue_time_seconds_count", labels)] == 3


def test_a_client_leaving_mid_stream_is_counted_not_logged_as_a_server_error(caplog):
    async def body():
        em = VllmEmulator(ServiceModel(decode_tokens_per_s=20))
        await em.start()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(em.url + "/v1/completions",
                                        json={"prompt": [1, 2], "max_tokens": 40, "stream": True}) as resp:
                    await resp.content.readany()  # the first token, then the client goes away
            for _ in range(400):  # the server sees the connection close
                if em.stats.disconnected:
                    break
                await asyncio.sleep(0.025)
            return em.stats
        finally:
            await em.stop()

    with caplog.at_level("ERROR"):
        stats = asyncio.run(body())
    assert stats.disconnected == 1 and stats.completed == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
