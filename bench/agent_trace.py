#!/usr/bin/env python3
"""The agent-trace benchmark of mla serve's prompt cache, beside llama-server's.

An agent resends its whole, growing context every turn. S sessions x T turns: each session
starts with a system prompt and tool list of --start-tokens tokens; each later turn is the
previous turn's context plus the previous answer, a tool result and a new message, growing
evenly to --end-tokens. Prompts are token ids (random, fixed by --seed; the first --shared-tokens
of them are the same in every session, as a system prompt is), so both servers read exactly the
same tokens. Each request asks for one token: its wall time is the time to the first token
(TTFT). Per turn it prints TTFT and prompt tokens/s for:

  cold      mla serve --no-prefix-cache: the whole context prefilled
  warm      mla serve with its pool and RAM tiers (the pool holds about one session; the other
            sessions' pages move to RAM between their turns)
  alone     the warm turn's new tokens prefilled on their own (a fresh prompt of that length):
            the target is warm <= 1.1 x alone
  at depth  the same new tokens at their real depth: cold TTFT of this turn less the previous
            turn's (what a perfect cache leaves: the new tokens attend to every cached token,
            which a fresh prompt of their length does not), and warm / at depth
  restart   mla serve --cache-dir, restarted before every turn with the page cache dropped
            (root only; said when not): the context read from disk
  llama     llama-server (--llama-server, --gguf) with its own prompt cache (--cache-ram), the
            same trace

then the restart probe: the last turn's context plus a 64-token message on a server restarted
on the same --cache-dir, its TTFT against the cold prefill of that context (target <= 0.05) and
its read rate (the disk tier's bytes over the TTFT) against this disk's sequential read rate,
measured in the same run with dd on a file of --disk-probe-gb (target >= 0.5).

Runtime: the cold and llama columns prefill every context whole. The defaults (2 sessions x 8
turns, 4k -> 32k tokens, the 6-layer bench checkpoint, 2 threads) take about 1.5 hours on 2
cores; --start-tokens 1024 --end-tokens 8192 --turns 4 about 10 minutes.

  /usr/bin/python3 bench/agent_trace.py [--mla build/mla] [--model DIR] [--sessions 2] [--turns 8]
      [--start-tokens 4096] [--end-tokens 32768] [--threads 2]
      [--llama-server /tmp/mla-peer/llama.cpp/build/bin/llama-server --gguf FILE]
"""
import argparse, json, os, random, re, shutil, signal, subprocess, sys, tempfile, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def post(url, body, timeout=7200):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return out, time.monotonic() - t0


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


def metric(text, name):
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


class Server:
    """A server process on a free port, its log in a file; stop() sends SIGTERM and waits."""

    def __init__(self, argv, log, ready_re, port_re=None, port=None):
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        self.port = port
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            text = open(log).read()
            if port_re and not self.port:
                m = re.search(port_re, text)
                if m:
                    self.port = int(m.group(1))
            if self.port and re.search(ready_re, text):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError("server did not start: " + " ".join(argv) + "\n" + open(log).read()[-2000:])

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=600)


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def drop_page_cache():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def disk_read_rate(folder, gb):
    """Sequential read rate of folder's file system in bytes/s: a file of gb GB written, the page
    cache dropped, read back with dd; None when the cache cannot be dropped."""
    path = os.path.join(folder, "disk-probe.bin")
    subprocess.run(["dd", "if=/dev/urandom", "of=" + path, "bs=16M", "count=%d" % max(1, int(gb * 64)),
                    "status=none"], check=True)
    if not drop_page_cache():
        os.unlink(path)
        return None
    t0 = time.monotonic()
    subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=16M", "status=none"], check=True)
    rate = os.path.getsize(path) / (time.monotonic() - t0)
    os.unlink(path)
    return rate


BENCH_MODEL = "/tmp/mla-bench-v2lite-6L-bf16"


def bench_checkpoint(mla, model, threads):
    """The checkpoint to serve: `model`, or mla bench's 6-layer bf16 one, written when missing.
    mla bench writes no tokenizer, so a checkpoint without one gets the DeepSeek-V3 tokenizer
    from the fixtures (../shared beside the checkout)."""
    if not model:
        model = BENCH_MODEL
        if not os.path.exists(os.path.join(model, "config.json")):
            subprocess.run([mla, "bench", "--layers", "6", "--weights", "bf16", "--threads", str(threads),
                            "--runs", "1", "--decode-tokens", "4", "--prompt-tokens", "0", "--batches", "0",
                            "--no-scaling"], check=True)
    if not os.path.exists(os.path.join(model, "tokenizer.json")):
        tok = os.path.join(ROOT, "..", "shared", "fixtures", "tokenizer", "deepseek-v3")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok, f), model)
    return model


def make_trace(a):
    rng = random.Random(a.seed)
    ids = lambda n: [rng.randrange(1000, 60000) for _ in range(n)]
    shared = ids(min(a.shared_tokens, a.start_tokens))
    lengths = [a.start_tokens + (a.end_tokens - a.start_tokens) * t // max(a.turns - 1, 1) for t in range(a.turns)]
    sessions = []
    for s in range(a.sessions):
        ctx = shared + ids(a.start_tokens - len(shared))
        turns = [list(ctx)]
        for t in range(1, a.turns):
            ctx = ctx + ids(lengths[t] - len(ctx))  # the answer, a tool result, a new message
            turns.append(list(ctx))
        sessions.append(turns)
    return sessions, ids


WARMUP = [7, 8, 9, 10, 11, 12, 13, 14]  # ids no trace prompt starts with


def mla_server(a, work, name, extra):
    """mla serve, started and warmed up: one 8-token request first, so that the first measured
    turn does not pay for code paged in after the page cache was dropped."""
    argv = [a.mla, "serve", "-m", a.model, "--port", "0", "--threads", str(a.threads),
            "--max-batch-tokens", str(a.batch_tokens), "--served-model-name", "bench"] + extra
    srv = Server(argv, os.path.join(work, name + ".log"), r"chat page|prompt cache:|http://", r"http://127\.0\.0\.1:(\d+)")
    mla_turn(srv, WARMUP)
    return srv


def mla_turn(srv, prompt):
    out, secs = post(srv.url("/v1/completions"), {"model": "bench", "prompt": prompt, "max_tokens": 1,
                                                  "temperature": 0})
    u = out["usage"]
    return secs, u["prompt_tokens"], u.get("prompt_tokens_details", {}).get("cached_tokens", 0)


def llama_turn(srv, prompt):
    out, secs = post(srv.url("/completion"), {"prompt": prompt, "n_predict": 1, "temperature": 0,
                                              "cache_prompt": True})
    t = out.get("timings", {})
    return secs, len(prompt), int(t.get("cache_n", 0))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mla", default=os.path.join(ROOT, "build", "mla"))
    p.add_argument("--model", default=None, help="checkpoint (default: mla bench's 6-layer bf16 one, with the DeepSeek-V3 tokenizer)")
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--start-tokens", type=int, default=4096)
    p.add_argument("--end-tokens", type=int, default=32768)
    p.add_argument("--shared-tokens", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--llama-server", default=None)
    p.add_argument("--gguf", default=None)
    p.add_argument("--work", default=None, help="scratch folder (default: a new one under /tmp)")
    p.add_argument("--disk-probe-gb", type=float, default=1.0)
    p.add_argument("--probe-only", action="store_true",
                   help="only the restart probe, on the cache a full run left in --work (same trace options)")
    a = p.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="mla-agent-trace-")
    os.makedirs(work, exist_ok=True)
    a.model = bench_checkpoint(a.mla, a.model, a.threads)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    per_token = cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2  # bf16
    sessions, ids = make_trace(a)
    order = [(t, s) for t in range(a.turns) for s in range(a.sessions)]
    print("agent trace: %d sessions x %d turns, %d -> %d tokens, %d shared; %s, %d threads; scratch %s" %
          (a.sessions, a.turns, a.start_tokens, a.end_tokens, a.shared_tokens, a.model, a.threads, work))
    pool_gb = (a.end_tokens + 2048) * per_token * 1.3 / 1e9  # about one session's pages
    res = {}
    if a.probe_only:
        return restart_probe(a, work, pool_gb, sessions, ids, None)

    # cold: every context prefilled whole (session 0's; the others' are as long)
    srv = mla_server(a, work, "cold", ["--no-prefix-cache", "--kv-cache-gb", "%.4f" % pool_gb])
    for t in range(a.turns):
        res[("cold", t)] = mla_turn(srv, sessions[0][t])
        print("  cold  turn %d: %6d tokens  TTFT %7.2f s" % (t, len(sessions[0][t]), res[("cold", t)][0]), flush=True)
    srv.stop()

    # warm: pool + RAM; then each turn's new tokens alone
    srv = mla_server(a, work, "warm", ["--kv-cache-gb", "%.4f" % pool_gb, "--cache-ram-gb", "8"])
    for t, s in order:
        res[("warm", t, s)] = mla_turn(srv, sessions[s][t])
        secs, n, cached = res[("warm", t, s)]
        if t > 0 and s == 0:  # the same count of new tokens in every session
            res[("alone", t, s)] = mla_turn(srv, ids(n - cached))
    ram_hits = metric(get(srv.url("/metrics")), 'mla_prompt_cache_hit_tokens_total{tier="ram"}')
    srv.stop()

    # restart: a new server on the same --cache-dir before every turn, the page cache dropped
    cache_dir = os.path.join(work, "cache")
    shutil.rmtree(cache_dir, ignore_errors=True)
    dropped = True
    for t in range(a.turns):
        dropped = drop_page_cache() and dropped
        srv = mla_server(a, work, "restart-%d" % t, ["--kv-cache-gb", "%.4f" % pool_gb, "--cache-dir", cache_dir])
        for s in range(a.sessions):
            res[("restart", t, s)] = mla_turn(srv, sessions[s][t])
        srv.stop()


    llama = None
    if a.llama_server and a.gguf:
        port = free_port()
        argv = [a.llama_server, "-m", a.gguf, "--port", str(port), "-t", str(a.threads), "-c",
                str(a.end_tokens + 4096), "-np", "1", "--cache-ram", "8192", "-b", str(a.batch_tokens)]
        srv = Server(argv, os.path.join(work, "llama.log"), r"listening on http", port=port)
        llama_turn(srv, WARMUP)
        for t, s in order:
            res[("llama", t, s)] = llama_turn(srv, sessions[s][t])
        srv.stop()
        llama = True

    print("\nper turn, TTFT in seconds (prompt tokens/s of the tokens computed); warm/alone target <= 1.1x")
    hdr = "turn sess  tokens  cached |   cold        |   warm        | alone  warm/alone | at depth  warm/it | restart cached  TTFT | "
    print(hdr + ("llama cached  TTFT   mla/llama" if llama else ""))
    for t, s in order:
        cold = res[("cold", t)]
        w = res[("warm", t, s)]
        r = res[("restart", t, s)]
        al = res.get(("alone", t, 0))
        line = "%4d %4d %7d %7d | %6.2f (%5.0f) | %6.2f (%5.0f) | " % (
            t, s, w[1], w[2], cold[0], cold[1] / cold[0], w[0], (w[1] - w[2]) / w[0])
        line += ("%5.2f  %5.2fx     | " % (al[0], w[0] / al[0])) if al else "  -       -       | "
        if t > 0:  # the new tokens' cost at their depth, from consecutive cold turns
            at = cold[0] - res[("cold", t - 1)][0]
            line += "%7.2f   %5.2fx | " % (at, w[0] / at)
        else:
            line += "   -         -    | "
        line += "%7d %6.2f | " % (r[2], r[0])
        if llama:
            l = res[("llama", t, s)]
            line += "%6d %6.2f  %5.2fx" % (l[2], l[0], l[0] / w[0])
        print(line)
    restart_probe(a, work, pool_gb, sessions, ids, res[("cold", a.turns - 1)][0])
    print("RAM tier served %d tokens in the warm run; page cache %s before each restart" %
          (ram_hits, "dropped" if dropped else "NOT dropped"))


def restart_probe(a, work, pool_gb, sessions, ids, cold_last):
    """The last turn's context plus a 64-token message on a server restarted on the cache, the
    page cache dropped: its TTFT against the cold prefill's, its read rate against dd's."""
    cache_dir = os.path.join(work, "cache")
    rate = disk_read_rate(work, a.disk_probe_gb)
    drop_page_cache()
    srv = mla_server(a, work, "probe", ["--kv-cache-gb", "%.4f" % pool_gb, "--cache-dir", cache_dir])
    probe = mla_turn(srv, sessions[0][-1] + ids(64))
    m = get(srv.url("/metrics"))
    disk_bytes = metric(m, "mla_prompt_cache_disk_read_bytes_total")
    read_secs = metric(m, "mla_prompt_cache_disk_read_seconds_total")
    srv.stop()
    if cold_last is None:  # --probe-only: the cold prefill of the same context, now
        cold = mla_server(a, work, "probe-cold", ["--no-prefix-cache", "--kv-cache-gb", "%.4f" % pool_gb])
        cold_last = mla_turn(cold, sessions[0][-1])[0]
        cold.stop()
    print("\nrestart probe: %d tokens, %d from disk, TTFT %.2f s against the cold prefill's %.2f s: %.3f (target <= 0.05)"
          % (probe[1], probe[2], probe[0], cold_last, probe[0] / cold_last))
    if rate and read_secs > 0:
        print("  the disk tier read %.0f MB in %.2f s: %.0f MB/s against dd's %.0f MB/s sequential: %.2f (target >= 0.5)"
              % (disk_bytes / 1e6, read_secs, disk_bytes / read_secs / 1e6, rate / 1e6, disk_bytes / read_secs / rate))
    else:
        print("  the page cache could not be dropped (not root): the disk figures are reads from RAM")


if __name__ == "__main__":
    sys.exit(main())
