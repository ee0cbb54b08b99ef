"""The LLM client ComSem talks to: any OpenAI-compatible chat endpoint.

``openai.AsyncOpenAI`` with a ``base_url`` reaches OpenAI, vLLM, Ollama or a llama.cpp server
alike. On top of it: bounded concurrency, temperature 0, retries with exponential backoff (and
the server's ``Retry-After``) on rate limits, server errors, timeouts and dropped connections
(tenacity), token and cost accounting, an on-disk reply cache (``ReplyCache``) so that nothing is
paid twice, and optionally the Batch API (half price, hours instead of minutes) for large runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tqdm.auto import tqdm

from sae_lens_bae.comsem.cache import ReplyCache, request_key

__all__ = ["ChatClient", "ClientConfig", "ComSemAPIError", "Reply", "Usage"]

Message = dict[str, str]

RETRYABLE = (
    openai.RateLimitError,
    openai.InternalServerError,
    openai.APITimeoutError,
    openai.APIConnectionError,
)
_BATCH_DONE = ("completed", "failed", "expired", "cancelled")


class ComSemAPIError(RuntimeError):
    """A request the server refused for good (or that kept failing after every retry)."""


@dataclass
class ClientConfig:
    """Where the LLM is and how to talk to it.

    ``base_url=None`` is OpenAI itself (``$OPENAI_API_KEY`` needed); a local server's URL, e.g.
    ``http://127.0.0.1:8000/v1`` for vLLM or ``http://127.0.0.1:11434/v1`` for Ollama, needs no
    key. Prices are USD per million prompt / completion tokens (0: cost not tracked).
    """

    model: str
    base_url: str | None = None
    api_key: str | None = None
    concurrency: int = 16
    temperature: float = 0.0
    max_tokens: int = 32
    timeout: float = 60.0
    max_attempts: int = 6
    retry_wait_min: float = 1.0
    retry_wait_max: float = 60.0
    price_input: float = 0.0
    price_output: float = 0.0
    batch_api: bool = False
    batch_poll_seconds: float = 30.0

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("ClientConfig.model is empty: name the served model, e.g. gpt-4o-mini")
        if self.concurrency < 1 or self.max_attempts < 1:
            raise ValueError("concurrency and max_attempts must be >= 1")

    def resolved_api_key(self) -> str:
        key = self.api_key or os.environ.get("OPENAI_API_KEY")
        if key:
            return key
        if self.base_url is None:
            raise ValueError(
                "No API key: set OPENAI_API_KEY (or pass api_key), or point base_url at a local "
                "OpenAI-compatible server"
            )
        return "not-needed"  # local servers ignore it, the client insists on one


@dataclass
class Reply:
    """One chat completion as ComSem uses it. ``text=None``: the server sent no usable message."""

    text: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    top_logprobs: dict[str, float] | None = None  # first generated token's alternatives
    batch: bool = False  # answered through the Batch API (half price)
    cached: bool = False

    def to_cache(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("cached")
        return data


@dataclass
class Usage:
    """What this run cost: requests that got a reply, retries, replies read from the cache, and the
    tokens and dollars of the replies paid for in this run."""

    requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    batches: list[str] = field(default_factory=list)


def _reply_from_response(response: Any, batch: bool = False) -> Reply:
    """A Reply from a chat.completions response (object, or dict from a batch output line)."""
    data = response if isinstance(response, dict) else response.model_dump()
    usage = data.get("usage") or {}
    choices = data.get("choices") or []
    text = None
    top: dict[str, float] | None = None
    if choices:
        message = choices[0].get("message") or {}
        text = message.get("content")
        content = (choices[0].get("logprobs") or {}).get("content") or []
        if content:
            top = {alt["token"]: alt["logprob"] for alt in content[0].get("top_logprobs") or []}
            top.setdefault(content[0]["token"], content[0]["logprob"])
    return Reply(
        text=text,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        top_logprobs=top,
        batch=batch,
    )


class ChatClient:
    """Chat completions with caching, concurrency, retries and accounting.

    ``complete_many`` is what ComSem's stages call: it answers a list of requests in order,
    from the cache where it can, and shows progress.
    """

    def __init__(self, config: ClientConfig, cache: ReplyCache | str | Path | None = None) -> None:
        self.config = config
        self.cache = cache if isinstance(cache, ReplyCache) else ReplyCache(cache)
        self.usage = Usage()
        self._api_key = config.resolved_api_key()
        self._client: openai.AsyncOpenAI | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._from_batch: set[str] = set()  # keys a batch job just answered (paid, not hits)

    def _openai(self) -> openai.AsyncOpenAI:
        """One AsyncOpenAI per event loop (its connection pool belongs to the loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = openai.AsyncOpenAI(
                api_key=self._api_key,
                base_url=self.config.base_url,
                timeout=self.config.timeout,
                max_retries=0,  # tenacity retries, so that every retry is counted and bounded
            )
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connections (before the event loop ends; a later call reopens)."""
        if self._client is not None:
            await self._client.close()
            self._client = self._loop = None

    def body(self, messages: Sequence[Message], logprobs: bool = False) -> dict[str, Any]:
        """The request body; its canonical JSON is the cache key."""
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": list(messages),
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }
        if logprobs:
            body |= {"logprobs": True, "top_logprobs": 10}
        return body

    def _account(self, reply: Reply) -> None:
        self.usage.prompt_tokens += reply.prompt_tokens
        self.usage.completion_tokens += reply.completion_tokens
        cost = (
            reply.prompt_tokens * self.config.price_input
            + reply.completion_tokens * self.config.price_output
        ) / 1e6
        self.usage.cost_usd += cost * (0.5 if reply.batch else 1.0)

    def _wait(self, state: RetryCallState) -> float:
        """Exponential backoff with jitter, at least the server's Retry-After when it sends one."""
        cfg = self.config
        wait = min(cfg.retry_wait_max, cfg.retry_wait_min * 2 ** (state.attempt_number - 1))
        wait *= 0.5 + random.random() / 2
        error = state.outcome.exception() if state.outcome else None
        response = getattr(error, "response", None)
        header = response.headers.get("retry-after") if response is not None else None
        if header and header.replace(".", "", 1).isdigit():  # seconds (not an HTTP date)
            wait = max(wait, min(float(header), cfg.retry_wait_max))
        return wait

    def _count_retry(self, state: RetryCallState) -> None:  # noqa: ARG002
        self.usage.retries += 1

    async def _request(self, body: dict[str, Any]) -> Reply:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(RETRYABLE),
            wait=self._wait,
            stop=stop_after_attempt(self.config.max_attempts),
            before_sleep=self._count_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._openai().chat.completions.create(**body)
        except RETRYABLE as e:
            raise ComSemAPIError(
                f"{self.config.base_url or 'OpenAI'} kept failing after "
                f"{self.config.max_attempts} attempts ({type(e).__name__}: {e}). Replies so far "
                "are cached; rerun the same command to resume."
            ) from e
        except openai.APIStatusError as e:
            raise ComSemAPIError(
                f"{self.config.base_url or 'OpenAI'} refused the request with HTTP "
                f"{e.status_code} ({e.message}); check the model name, API key and base URL. "
                "Replies so far are cached; rerun to resume."
            ) from e
        except openai.APIError as e:  # a reply that is not a chat completion at all
            raise ComSemAPIError(
                f"{self.config.base_url or 'OpenAI'} sent an unusable response ({e}); is it an "
                "OpenAI-compatible /v1 endpoint? Replies so far are cached; rerun to resume."
            ) from e
        self.usage.requests += 1
        return _reply_from_response(response)

    async def complete(
        self, messages: Sequence[Message], *, logprobs: bool = False, semaphore: Any = None
    ) -> Reply:
        """One reply, from the cache or the server (then cached at once)."""
        body = self.body(messages, logprobs)
        key = request_key(body)
        hit = self.cache.get(key)
        if hit is not None:
            if key in self._from_batch:
                self._from_batch.discard(key)
                return Reply(**hit)
            self.usage.cache_hits += 1
            return Reply(**hit, cached=True)
        if semaphore is None:
            reply = await self._request(body)
        else:
            async with semaphore:
                reply = await self._request(body)
        self.cache.put(key, body, reply.to_cache())
        self._account(reply)
        return reply

    async def complete_many(
        self,
        requests: Sequence[Sequence[Message]],
        *,
        logprobs: bool = False,
        desc: str = "LLM requests",
        progress: bool = True,
    ) -> list[Reply]:
        """Replies to ``requests``, in order: at most ``concurrency`` in flight, or one Batch API
        job for the uncached ones when ``batch_api`` is set."""
        if self.config.batch_api:
            await self._run_batch(requests, logprobs, desc, progress)
        semaphore = asyncio.Semaphore(self.config.concurrency)
        bar = tqdm(total=len(requests), desc=desc, disable=not progress)

        async def one(messages: Sequence[Message]) -> Reply:
            reply = await self.complete(messages, logprobs=logprobs, semaphore=semaphore)
            bar.update()
            return reply

        tasks = [asyncio.ensure_future(one(m)) for m in requests]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:  # stop what is still in flight; what arrived is cached
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            bar.close()

    async def _run_batch(
        self, requests: Sequence[Sequence[Message]], logprobs: bool, desc: str, progress: bool
    ) -> None:
        """Answer the uncached requests through one Batch API job and cache its replies; any the
        job did not answer are left for the direct path. A job already submitted for the same
        requests (a resumed run) is polled, not submitted again."""
        bodies = {}
        for messages in requests:
            body = self.body(messages, logprobs)
            key = request_key(body)
            if self.cache.get(key) is None:
                bodies[key] = body
        if not bodies:
            return
        client = self._openai()
        job_key = request_key({"batch": sorted(bodies)})
        batch_id = self.cache.pending_batch(job_key)
        if batch_id is None:
            lines = [
                json.dumps(
                    {"custom_id": key, "method": "POST", "url": "/v1/chat/completions", "body": b}
                )
                for key, b in bodies.items()
            ]
            upload = await client.files.create(
                file=("comsem_requests.jsonl", ("\n".join(lines) + "\n").encode()),
                purpose="batch",
            )
            batch = await client.batches.create(
                input_file_id=upload.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={"source": "sae-lens-bae comsem", "stage": desc},
            )
            batch_id = batch.id
            self.cache.set_pending_batch(job_key, batch_id)
        self.usage.batches.append(batch_id)
        bar = tqdm(total=len(bodies), desc=f"{desc} (batch {batch_id})", disable=not progress)
        while True:
            batch = await client.batches.retrieve(batch_id)
            counts = batch.request_counts
            if counts is not None:
                bar.n = counts.completed + counts.failed
                bar.refresh()
            if batch.status in _BATCH_DONE:
                break
            await asyncio.sleep(self.config.batch_poll_seconds)
        bar.close()
        if batch.status != "completed":
            warnings.warn(
                f"Batch {batch_id} ended {batch.status}; its unanswered requests are sent "
                "directly instead",
                stacklevel=2,
            )
        if batch.output_file_id:
            content = await client.files.content(batch.output_file_id)
            for line in content.text.splitlines():
                if not line.strip():
                    continue
                item = json.loads(line)
                response = item.get("response") or {}
                key = item.get("custom_id")
                if key in bodies and response.get("status_code") == 200:
                    reply = _reply_from_response(response.get("body") or {}, batch=True)
                    self.cache.put(key, bodies[key], reply.to_cache())
                    self._from_batch.add(key)
                    self._account(reply)
                    self.usage.requests += 1
        self.cache.set_pending_batch(job_key, None)
