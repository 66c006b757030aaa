#!/usr/bin/env python3
"""Load test of an OpenAI-compatible completions endpoint (standard library only).

For each concurrency level C, C client threads each send streamed
`/v1/completions` requests back to back for `--seconds` (after the first
request of each has started), recording when every streamed chunk arrives.

Reported per level (one JSON object per line on stdout):
- tokens_per_s: streamed content chunks received by all clients / wall time;
- p50/p99 time per token (ms): gaps between consecutive chunks of a request;
- p50/p99 time to first token (ms).

The same script drives `privmix serve` and llama.cpp's `llama-server`, so both
are measured by one client on one machine.
"""

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def one_request(url, model, key, prompt, max_tokens):
    """Streams one completion; returns (start, [chunk arrival times], status)."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens,
        "stream": True, "temperature": 1.0,
    })
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    start = time.perf_counter()
    conn.request("POST", u.path.rstrip("/") + "/v1/completions", body, headers)
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        conn.close()
        return start, [], resp.status
    arrivals = []
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        choices = chunk.get("choices") or []
        if choices and choices[0].get("text"):
            arrivals.append(time.perf_counter())
    conn.close()
    return start, arrivals, 200


def run_level(args, clients):
    urls = args.url.split(",")
    lock = threading.Lock()
    gaps, ttfts, tokens, statuses = [], [], [0], {}
    deadline = [None]

    def client(i):
        while True:
            now = time.perf_counter()
            if deadline[0] is not None and now > deadline[0]:
                return
            start, arrivals, status = one_request(
                urls[i % len(urls)], args.model, args.key, args.prompt, args.max_tokens)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                if status != 200:
                    return
                tokens[0] += len(arrivals)
                if arrivals:
                    ttfts.append(arrivals[0] - start)
                    gaps.extend(b - a for a, b in zip(arrivals, arrivals[1:]))

    t0 = time.perf_counter()
    deadline[0] = t0 + args.seconds
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ms = lambda x: None if x is None else round(1000 * x, 2)
    return {
        "label": args.label, "clients": clients, "wall_s": round(wall, 2),
        "tokens": tokens[0], "tokens_per_s": round(tokens[0] / wall, 2),
        "p50_ms_per_token": ms(percentile(gaps, 50)),
        "p99_ms_per_token": ms(percentile(gaps, 99)),
        "p50_ms_first_token": ms(percentile(ttfts, 50)),
        "p99_ms_first_token": ms(percentile(ttfts, 99)),
        "requests": statuses,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True,
                   help="server URL, or several separated by commas: client i uses the "
                        "i-th modulo their number")
    p.add_argument("--model", required=True)
    p.add_argument("--key", default=None)
    p.add_argument("--label", default="server")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt", default="The history of the city begins")
    args = p.parse_args()
    for c in [int(x) for x in args.clients.split(",")]:
        print(json.dumps(run_level(args, c)), flush=True)


if __name__ == "__main__":
    main()
