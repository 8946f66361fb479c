"""The agent endpoint's own cost per call: server CPU per call and per token, the client's apart.

    python scripts/bench_endpoint.py [--rounds 5] [--episodes 40] [--calls 4] [--tokens 16,128]
                                     [--per-call-calls 20] [--json out.json]

A server process runs the real episode runner (`envs.runner.EpisodeRunner`, its environment
thread and asyncio loop) with the real agent body (`envs.agent.AgentEpisodes`: the aiohttp
endpoint, one `envs.agent_session.Session` per episode), a scripted decode loop in place of the
backend (each turn answered at once with `--tokens` ids ending in eos), and, on a thread and loop
of its own, a bare aiohttp echo server on the same stack (the same route shape; it parses the JSON
body and answers a canned chat completion of the same size): the baseline of what any HTTP server
on this stack costs per call. The client (this process) plays each episode with the `openai`
client over one pooled `httpx.Client`: `--calls` chat calls, each extending the conversation (the
turn sent back, a tool reply). Measured per round:
- server CPU: the CPU time of the endpoint's threads (the environment loop, which serves HTTP and
  runs the session, and the render thread, which tokenizes and decodes; by
  `time.pthread_getcpuclockid`) per call, not counting the scripted decode loop or the agent's
  thread; and the echo thread's per call; their difference is the endpoint's own share beyond the
  HTTP stack; per token: the endpoint's per-call CPU over the tokens a call carries (prompt +
  completion), and the slope between the `--tokens` sizes (CPU per completion token);
- client CPU per call (`time.process_time` of this process, which only runs the client);
- calls/s with the pooled client and with a new `openai.OpenAI` per call (its own pool, as the
  README's first agent example did), `--per-call-calls` calls of each.
Prints each figure's median over `--rounds` with its min-max, and the ratios. Goal (#38): the
server's share <= 1 ms per call.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")

STEP_S = 0.0002           # the scripted decode loop's poll
WAIT_S = 60.0


def _thread_cpu(threads) -> float:
    return sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in threads
               if t.ident is not None and t.is_alive())


def _echo(body: bytes, ready: "threading.Event", box: dict) -> None:
    """The baseline: a bare aiohttp server on its own thread and loop, the endpoint's route shape."""
    import asyncio

    from aiohttp import web

    async def handle(request):
        json.loads(await request.read())
        return web.Response(body=body, content_type="application/json")

    async def main():
        app = web.Application(client_max_size=64 << 20)
        app.add_routes([web.post("/e/{key}/v1/chat/completions", handle)])
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}/e/echo/v1"
        ready.set()
        await asyncio.Event().wait()
    asyncio.run(main())


def serve(conn, tokens_per_turn: int) -> None:
    """The server process: runner + endpoint + scripted decode loop + echo server; commands on
    `conn`: ("open",) -> (base_url, key), ("close", key), ("cpu",) -> (endpoint s, echo s)."""
    import queue

    from orchestrator.config import TaskConfig
    from orchestrator.data.tokens import load_tokens
    from orchestrator.envs.agent import AgentEpisodes
    from orchestrator.envs.render import TurnRenderer
    from orchestrator.envs.runner import EpisodeRunner, Limits
    from shm.codec import Sequences

    tokens = load_tokens(None)
    tok = tokens.tokenizer
    turn = [int(t) for t in tok("1" * (tokens_per_turn - 1), add_special_tokens=False)["input_ids"]]
    turn.append(tokens.eos_id)
    handoff: "queue.Queue" = queue.Queue()
    release: dict = {}

    def agent(row, base_url, api_key):
        done = release.setdefault(api_key, queue.Queue())
        handoff.put((base_url, api_key))
        return done.get(timeout=WAIT_S)

    rows = lambda is_eval, row: {"prompt": "47>"}          # noqa: E731
    lim = Limits(max_turns=1000, max_new_tokens=tokens_per_turn, max_episode_tokens=1 << 20,
                 timeout_s=WAIT_S, on_error="fail", workers=2)
    episodes = AgentEpisodes(agent, lambda row: [1], None, WAIT_S, 8, ("policy",))
    r = EpisodeRunner(None, {}, TurnRenderer(tokens, TaskConfig()), tokens, rows, lim, "bench",
                      seed=0, agent=episodes)
    canned = json.dumps({"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "policy",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": "1" * (tokens_per_turn - 1)},
                                      "finish_reason": "stop", "logprobs": None}],
                         "usage": {"prompt_tokens": 8, "completion_tokens": tokens_per_turn,
                                   "total_tokens": 8 + tokens_per_turn}}).encode()
    ready, box = threading.Event(), {}
    echo = threading.Thread(target=_echo, args=(canned, ready, box), name="echo", daemon=True)
    echo.start()
    ready.wait(WAIT_S)
    endpoint_threads = lambda: [t for t in threading.enumerate()      # noqa: E731
                                if t is r._thread or t.name.startswith("env-render")]
    conn.send(box["url"])
    rid = 0
    try:
        while True:
            for t in r.requests():
                r.turn_done(t.key, Sequences.build(0, t.key, 0, [
                    {"prompt": list(t.ids), "completion": turn[:t.max_new_tokens],
                     "logprobs": [-0.5] * min(len(turn), t.max_new_tokens), "versions": 0}]))
            r.aborts()
            r.ready()
            if not conn.poll(STEP_S):
                continue
            cmd = conn.recv()
            if cmd[0] == "open":
                rid += 1
                r.start(rid, prompt_id=rid, row=0, n=1, is_eval=False, temperature=1.0)
                while True:               # answer turns while the agent starts
                    try:
                        conn.send(handoff.get(timeout=STEP_S))
                        break
                    except queue.Empty:
                        continue
            elif cmd[0] == "close":
                release[cmd[1]].put(1.0)
            elif cmd[0] == "cpu":
                conn.send((_thread_cpu(endpoint_threads()), _thread_cpu([echo])))
            elif cmd[0] == "stop":
                return
    finally:
        r.close()


class Server:
    def __init__(self, tokens: int):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, tokens), daemon=True)
        self.proc.start()
        self.echo_url = self._recv()

    def _recv(self):
        if not self.conn.poll(WAIT_S):
            raise TimeoutError("the bench server did not answer within 60 s")
        return self.conn.recv()

    def ask(self, *cmd):
        self.conn.send(cmd)
        return self._recv() if cmd[0] in ("open", "cpu") else None

    def stop(self) -> None:
        self.conn.send(("stop",))
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


def episode(server: Server, calls: int, http=None) -> int:
    """One episode: `calls` chat calls extending the conversation; the tokens they carried."""
    from openai import OpenAI

    base_url, key = server.ask("open")
    carried = 0
    msgs: list = [{"role": "user", "content": "47>"}]
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=WAIT_S, http_client=http)
    for _ in range(calls):
        if http is None:          # a client per call: its own pool
            client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=WAIT_S)
        r = client.chat.completions.create(model="policy", messages=msgs)
        carried += r.usage.total_tokens
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "tool", "content": "=83>"}]
    server.ask("close", key)
    return carried


def echo_calls(server: Server, n: int, http) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.echo_url, api_key="x", max_retries=0, timeout=WAIT_S, http_client=http)
    msgs = [{"role": "user", "content": "47>"}]
    for _ in range(n):
        client.chat.completions.create(model="policy", messages=msgs)


def one_round(server: Server, args, http) -> dict:
    n = args.episodes * args.calls
    cpu0, echo0 = server.ask("cpu")
    c0, w0 = time.process_time(), time.perf_counter()
    tokens = sum(episode(server, args.calls, http) for _ in range(args.episodes))
    c1, w1 = time.process_time(), time.perf_counter()
    cpu1, _ = server.ask("cpu")
    echo_calls(server, n, http)
    _, echo1 = server.ask("cpu")
    per = max(1, args.per_call_calls // args.calls)
    w2 = time.perf_counter()
    for _ in range(per):
        episode(server, args.calls, None)
    w3 = time.perf_counter()
    return {"server_ms": (cpu1 - cpu0) / n * 1e3, "echo_ms": (echo1 - echo0) / n * 1e3,
            "client_ms": (c1 - c0) / n * 1e3, "tokens_per_call": tokens / n,
            "pooled_calls_s": n / (w1 - w0), "per_call_calls_s": per * args.calls / (w3 - w2)}


def _fmt(xs: list[float], digits: int = 3) -> str:
    return f"{statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}-{max(xs):.{digits}f}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--episodes", type=int, default=40, help="episodes per round (pooled client)")
    p.add_argument("--calls", type=int, default=4, help="chat calls per episode")
    p.add_argument("--tokens", default="16,128", help="completion tokens per turn, a comma list")
    p.add_argument("--per-call-calls", type=int, default=20, help="calls with a client per call, per round")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import httpx

    sizes = [int(x) for x in args.tokens.split(",")]
    table = {}
    for k in sizes:
        server = Server(k)
        try:
            with httpx.Client(timeout=WAIT_S) as http:
                one_round(server, argparse.Namespace(**{**vars(args), "episodes": 2}), http)   # warm-up
                rounds = [one_round(server, args, http) for _ in range(args.rounds)]
        finally:
            server.stop()
        col = {f: [r[f] for r in rounds] for f in rounds[0]}
        col["share_ms"] = [r["server_ms"] - r["echo_ms"] for r in rounds]
        col["server_over_echo"] = [r["server_ms"] / r["echo_ms"] for r in rounds]
        col["server_us_per_token"] = [r["server_ms"] * 1e3 / r["tokens_per_call"] for r in rounds]
        col["pooled_over_per_call"] = [r["pooled_calls_s"] / r["per_call_calls_s"] for r in rounds]
        table[k] = col
        print(f"completion tokens per turn {k} ({statistics.median(col['tokens_per_call']):.0f} tokens "
              f"a call carries), {args.rounds} rounds of {args.episodes * args.calls} calls; median [min-max]:")
        print(f"  server CPU per call (endpoint threads)  {_fmt(col['server_ms'])} ms")
        print(f"  echo server CPU per call (same stack)   {_fmt(col['echo_ms'])} ms")
        print(f"  endpoint's share beyond the echo        {_fmt(col['share_ms'])} ms")
        print(f"  server / echo                           {_fmt(col['server_over_echo'], 2)}x")
        print(f"  server CPU per token carried            {_fmt(col['server_us_per_token'], 2)} us")
        print(f"  client CPU per call (openai, pooled)    {_fmt(col['client_ms'])} ms")
        print(f"  calls/s pooled client                   {_fmt(col['pooled_calls_s'], 0)}")
        print(f"  calls/s a client per call               {_fmt(col['per_call_calls_s'], 1)}")
        print(f"  pooled / client per call                {_fmt(col['pooled_over_per_call'], 1)}x")
    if len(sizes) > 1:
        a, b = sizes[0], sizes[-1]
        slope = [(y - x) * 1e3 / (b - a) for x, y in zip(table[a]["server_ms"], table[b]["server_ms"])]
        print(f"server CPU per completion token (slope {a} -> {b}): {_fmt(slope, 2)} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(k): {f: v for f, v in col.items()} for k, col in table.items()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
