"""Judged records per second of ComSem's client against a loopback server with simulated latency.

    python benchmarks/comsem_throughput.py [--latency 0.1] [--concurrency 64] [--records 2000]

The real ``openai`` client over HTTP to ``sae_lens_bae.comsem.loopback.LoopbackServer``, each
reply delayed by ``--latency`` seconds; judge requests shaped like ComSem's (the package's
templates, one record each), no cache. The baseline is the same client at concurrency 1 on fewer
records, in this process; the figure is records per second and its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from sae_lens_bae.comsem import ChatClient, ClientConfig, Sample, load_templates
from sae_lens_bae.comsem.loopback import LoopbackServer


def _requests(n: int) -> list[list[dict[str, str]]]:
    templates = load_templates()
    return [
        templates.judge_messages(
            'the word "bank"',
            Sample(i, " bank", 7, f"record {i}: they sat on the river<< bank>> all day"),
        )
        for i in range(n)
    ]


def _rate(server: LoopbackServer, concurrency: int, n: int) -> float:
    config = ClientConfig(model="rules", base_url=server.base_url, concurrency=concurrency)
    client = ChatClient(config, None)  # in-memory cache: every request goes to the server
    start = time.perf_counter()

    async def run() -> list:
        try:
            return await client.complete_many(_requests(n), desc=f"concurrency {concurrency}")
        finally:
            await client.aclose()

    replies = asyncio.run(run())
    seconds = time.perf_counter() - start
    assert len(replies) == n and client.usage.requests == n
    return n / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--baseline-records", type=int, default=30)
    args = parser.parse_args()
    with LoopbackServer(latency=args.latency) as server:
        baseline = _rate(server, 1, args.baseline_records)
        rate = _rate(server, args.concurrency, args.records)
    result = {
        "latency_s": args.latency,
        "concurrency": args.concurrency,
        "records": args.records,
        "records_per_s": round(rate, 1),
        "baseline_concurrency_1_records_per_s": round(baseline, 1),
        "speedup": round(rate / baseline, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
