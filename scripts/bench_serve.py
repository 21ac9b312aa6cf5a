"""Load test of an OpenAI-compatible server: CLIENTS concurrent clients each
send REQUESTS streamed chat completions (one system prompt shared by all, a
question of their own), and the figures come out as one JSON line per
concurrency: requests/s, time to first token, inter-token latency, and the
prefix-cache hit rate from `usage` where the server reports it.

    python3 scripts/bench_serve.py URL [--clients 1,4,16] [--requests 4] [--max-tokens 32]
"""

import argparse
import json
import statistics
import threading
import time
import urllib.request

SYSTEM = (
    "You are the archivist of a small maritime museum. Answer visitors' questions "
    "about lighthouses, their keepers and the ships they guided, in two or three "
    "plain sentences. The museum holds the logs of Gull Rock Light from 1890 to 1952, "
    "the lamp of its first-order Fresnel lens, the keepers' letters to the Lighthouse "
    "Board, and charts of the rocks and channels around Port Elnor and Kellan Cove. "
    "When a question is outside what the collection covers, say so briefly."
)

QUESTIONS = [
    "What did a lighthouse keeper do during fog?",
    "Why were lighthouses converted to electric lamps?",
    "How did a Fresnel lens work?",
    "What was a fog horn used for?",
    "Who inspected lighthouses for the Board?",
    "How often was the lamp wick trimmed?",
    "What supplies did the keepers receive by boat?",
    "Why were some lighthouses closed?",
]


def one_request(url, question, max_tokens):
    body = json.dumps({
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    request = urllib.request.Request(url + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    arrivals, usage = [], None
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    arrivals.append(time.perf_counter())
    first = arrivals[0] - start if arrivals else None
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"seconds": time.perf_counter() - start, "ttft": first, "gaps": gaps, "usage": usage}


def run(url, clients, requests_each, max_tokens):
    results, lock = [], threading.Lock()

    def client(index):
        for n in range(requests_each):
            question = QUESTIONS[(index * requests_each + n) % len(QUESTIONS)]
            result = one_request(url, question, max_tokens)
            with lock:
                results.append(result)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    answered = [r for r in results if r["ttft"] is not None]
    ttfts = [r["ttft"] for r in answered]
    gaps = [g for r in results for g in r["gaps"]]
    usages = [r["usage"] for r in results if r["usage"]]
    cached = [((u.get("prompt_tokens_details") or {}).get("cached_tokens")) for u in usages]
    hit = None
    if usages and all(c is not None for c in cached):
        hit = sum(cached) / sum(u["prompt_tokens"] for u in usages)
    return {
        "clients": clients,
        "requests": len(results),
        # A server that cuts a stream short when the next request arrives
        # (llama-cpp-python's default) would look fast; count what was answered.
        "answered": len(answered),
        "requests_per_second": len(results) / wall,
        "ttft_median_s": statistics.median(ttfts) if ttfts else None,
        "ttft_p90_s": sorted(ttfts)[int(0.9 * (len(ttfts) - 1))] if ttfts else None,
        "inter_token_median_s": statistics.median(gaps) if gaps else None,
        "completion_tokens": sum(u["completion_tokens"] for u in usages) if usages else None,
        "content_chunks": sum(len(r["gaps"]) + 1 for r in answered),
        "cache_hit_rate": hit,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url", help="the API root, e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    one_request(args.url, QUESTIONS[0], 4)  # warm up: load, first allocations
    for clients in [int(c) for c in args.clients.split(",")]:
        print(json.dumps(run(args.url, clients, args.requests, args.max_tokens)), flush=True)


if __name__ == "__main__":
    main()
