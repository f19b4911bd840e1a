#!/usr/bin/env python3
"""A 100k-token request through mla serve while other sessions decode.

Starts `mla serve` on the bench checkpoint (written when missing, as bench/agent_trace.py does), starts
--decoders streaming sessions that decode until the end, then sends one streamed request of
--tokens prompt tokens (random ids) asking for a few tokens. It prints:

  - the long request's time to first token and its prompt rate, and how many keep-alive comments
    the server sent it while its prompt was read (a client with a read timeout stays connected);
  - the decoding sessions' gaps between tokens while the long prompt was read: median, 99th
    percentile and the longest, beside the server's own longest decode pass
    (mla_engine_decode_step_seconds_max) — the bound that --chunk-depth sets;
  - the KV pool's size beside `mla analyze`'s latent bytes per token times the pool's tokens (the
    pool is populated when the server starts), and the server's anonymous resident memory before
    and at its peak during the long request: the growth is the forward pass's working memory;
  - a request one token past the context: its status and message (a 400 naming both numbers).

Runtime: the prompt is read in full; on 2 cores of an AMD Zen 5 machine, the 6-layer bench
checkpoint reads 100k tokens in about half an hour (1,755 and 1,832 s in two runs). --tokens 16384 takes about
two minutes.

  /usr/bin/python3 bench/long_request.py [--mla build/mla] [--model DIR] [--tokens 100000]
      [--decoders 2] [--threads 2] [--chunk-depth 16384] [--max-batch-tokens 512]
"""
import argparse, http.client, json, os, random, re, statistics, subprocess, sys, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from agent_trace import Server, bench_checkpoint, get, metric, free_port  # noqa: E402


def stream(port, body, on_chunk, timeout=7200):
    """POSTs a streamed completion; on_chunk(kind, t) per SSE data line ('data') or comment
    ('keepalive'). Returns the HTTP status and, for an error, the body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        return r.status, r.read().decode()
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if line.startswith(b":"):
            on_chunk("keepalive", time.monotonic())
        elif line.startswith(b"data:") and line != b"data: [DONE]":
            on_chunk("data", time.monotonic())
    conn.close()
    return 200, ""


def rss_kb(pid, field):
    for line in open("/proc/%d/status" % pid):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mla", default=os.path.join(os.path.dirname(HERE), "build", "mla"))
    p.add_argument("--model", default=None, help="default: mla bench's 6-layer bf16 checkpoint, written when missing")
    p.add_argument("--tokens", type=int, default=100000)
    p.add_argument("--decoders", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk-depth", type=int, default=16384)
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if a.model and not os.path.isdir(a.model):
        sys.exit("no checkpoint at %s" % a.model)
    a.model = bench_checkpoint(a.mla, a.model, a.threads)
    rng = random.Random(a.seed)
    ids = lambda n: [rng.randrange(1000, 60000) for _ in range(n)]

    analyze = json.loads(subprocess.run([a.mla, "analyze", "--config", os.path.join(a.model, "config.json"), "--json"],
                                        check=True, capture_output=True, text=True).stdout)
    latent_bytes = analyze["kv"]["latent_bytes_per_token_bf16"]
    kv_gb = (a.tokens + 4096 * (a.decoders + 1)) * latent_bytes / 1e9 * 1.1
    port = free_port()
    log = "/tmp/mla-long-request.log"
    srv = Server([a.mla, "serve", "--model", a.model, "--port", str(port), "--threads", str(a.threads), "--kv-cache-gb",
                  "%.3f" % kv_gb, "--cache-ram-gb", "0", "--chunk-depth", str(a.chunk_depth),
                  "--max-batch-tokens", str(a.max_batch_tokens)], log, r"on http://", port=port)
    print("long request: %d tokens, %d decoding sessions, --chunk-depth %d, --max-batch-tokens %d, %s, %d threads"
          % (a.tokens, a.decoders, a.chunk_depth, a.max_batch_tokens, a.model, a.threads), flush=True)
    try:
        # Warm-up, then the decoders.
        stream(port, {"prompt": ids(64), "max_tokens": 4, "stream": True}, lambda k, t: None)
        stop = threading.Event()
        times = [[] for _ in range(a.decoders)]

        def decode(i):
            def on(kind, t):
                if kind == "data":
                    times[i].append(t)
                if stop.is_set():
                    raise StopIteration
            try:
                while not stop.is_set():  # a session that reaches max_tokens starts again
                    # logprobs: an event per token, also for one whose text waits for the next
                    # (a token ending inside a UTF-8 character sends no text of its own).
                    status, err = stream(port, {"prompt": ids(64), "max_tokens": 4096, "ignore_eos": True,
                                                "logprobs": 1, "stream": True}, on)
                    if status != 200:
                        sys.exit("a decoding session failed: %d %s" % (status, err))
            except StopIteration:
                pass

        threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(a.decoders)]
        for t in threads:
            t.start()
        time.sleep(3)
        # Anonymous memory only: the weights are a mapped file whose pages count as resident
        # once read, and a long prompt reads experts the warm-up did not.
        rss0 = rss_kb(srv.proc.pid, "RssAnon")
        peak = [rss0]

        def watch():
            last = time.monotonic()
            while not stop.is_set():
                peak[0] = max(peak[0], rss_kb(srv.proc.pid, "RssAnon"))
                time.sleep(0.2)
                if time.monotonic() - last >= 60:  # progress, so that a cut run still says something
                    last = time.monotonic()
                    m = get(srv.url("/metrics"))
                    print("  %5.0f s: %d tokens computed in %d passes, longest decode pass %.2f s, anonymous memory "
                          "%.2f GB" % (last - t0, metric(m, "mla_computed_tokens_total"),
                                       metric(m, "mla_engine_steps_total"),
                                       metric(m, "mla_engine_decode_step_seconds_max"), peak[0] * 1024 / 1e9),
                          flush=True)

        events = []
        t0 = time.monotonic()
        threading.Thread(target=watch, daemon=True).start()
        status, err = stream(port, {"prompt": ids(a.tokens), "max_tokens": 4, "stream": True},
                             lambda k, t: events.append((k, t)))
        t_end = time.monotonic()
        stop.set()
        hwm = peak[0]
        if status != 200:
            sys.exit("the long request failed: %d %s" % (status, err))
        first = next(t for k, t in events if k == "data")
        keepalives = sum(1 for k, t in events if k == "keepalive" and t < first)
        ttft = first - t0
        print("time to first token %.1f s (%.0f prompt tokens/s), %d keep-alive comments before it"
              % (ttft, a.tokens / ttft, keepalives))
        gaps = []
        for ts in times:
            gaps += [b - a_ for a_, b in zip(ts, ts[1:]) if t0 <= a_ and b <= first]
        m = get(srv.url("/metrics"))
        step_max = metric(m, "mla_engine_decode_step_seconds_max")
        if gaps:
            gaps.sort()
            print("decoding sessions while it was read: %d tokens, gap median %.3f s, p99 %.3f s, longest %.3f s; "
                  "the longest decode pass %.3f s" % (len(gaps), statistics.median(gaps),
                                                      gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))], gaps[-1], step_max))
        else:
            print("decoding sessions got no tokens while it was read")
        # The KV pool is allocated and populated when the server starts (src/kv/huge_memory.cpp),
        # so it is resident before the request: its size is checked against mla analyze, and the
        # growth while the request is read is the forward pass's working memory at depth.
        pool_tokens = metric(m, "mla_kv_pages_total") * metric(m, "mla_kv_page_size_tokens")
        pool_bytes = pool_tokens * metric(m, "mla_kv_bytes_per_token")
        growth = (hwm - rss0) * 1024
        print("KV pool %.3f GB for %d tokens, resident from the start; mla analyze: %d latent bytes/token x %d tokens "
              "= %.3f GB (%.2fx); the long request holds %.3f GB of it" %
              (pool_bytes / 1e9, pool_tokens, latent_bytes, pool_tokens, latent_bytes * pool_tokens / 1e9,
               pool_bytes / max(1, latent_bytes * pool_tokens), latent_bytes * (a.tokens + 4) / 1e9))
        print("anonymous resident memory %.2f GB before the request (pool included), %.2f GB at its peak: +%.2f GB of "
              "working memory" % (rss0 * 1024 / 1e9, hwm * 1024 / 1e9, growth / 1e9))
        # One token past the context.
        room = json.loads(get(srv.url("/v1/models")))["data"][0].get("max_model_len") or 0
        too_long = (room or 163840) + 1
        status, err = stream(port, {"prompt": ids(too_long), "max_tokens": 1, "stream": True}, lambda k, t: None)
        print("a prompt of %d tokens: HTTP %d %s" % (too_long, status, err.strip()[:300]))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
