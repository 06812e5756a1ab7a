"""A loopback stand-in for `python -m sglang.launch_server`, for CPU tests only.

It speaks the parts of SGLang's HTTP API that specbuild uses, with deterministic fake numbers:
  GET  /health, /health_generate, /server_info, /v1/models, /model_info
  POST /generate            text or input_ids (single or batch), stream (SSE), meta_info with
                            prompt_tokens, completion_tokens, finish_reason, e2e_latency and,
                            when a drafter is loaded, spec_verify_ct / spec_accept_length;
                            return_hidden_states (needs --enable-return-hidden-states)
  POST /v1/chat/completions OpenAI-style, with usage and reasoning_content
  POST /v1/completions      raw prompt (text or token ids); the text depends on it and the seed;
                            stream (SSE, one chunk per step, usage chunk on include_usage)

Its argument parser rejects unknown flags the way SGLang's does, and `--help` lists the flags
it knows; `--config FILE.yaml` reads flags from a YAML mapping first (`api-key: K`), as
SGLang's does, the command line's own flags winning. With an API key K every route but
/health* answers 401 unless the request carries
`Authorization: Bearer K`, as SGLang's middleware does; like SGLang it prints its arguments,
the key included, at start (the log must mask it).
Behaviour switches for failure tests come from the environment (the sweep sets env):
  SGLANG_STUB_EXIT=<code>        exit with that code before binding the port
  SGLANG_STUB_NEVER_HEALTHY=1    answer /health_generate with 503 forever
  SGLANG_STUB_ACCEPT=<k>         tokens per verify step with a drafter (default 3)
  SGLANG_STUB_STEP_S=<seconds>   sleep per forward step (default 0.0005)
  SGLANG_STUB_REASONING=1        chat replies carry reasoning_content
  SGLANG_STUB_CHILD=1            spawn a child process that ignores SIGTERM
  SGLANG_STUB_DIE_AFTER=<n>      exit (code 3) on the request after the first n POSTs

Hidden states: a plain server returns one "final" state [T, H] per prompt token; with an EAGLE3
drafter loaded it returns the three aux states [T, 3H] for the layer ids in the drafter's
config.json. Value of token t, layer l, dim j: stub_feature(token, position, l, j) below, which
tests recompute. Without --disable-radix-cache a repeated prefix is served from "cache" and its
rows are missing from the prefill hidden states, exactly as in SGLang.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FINAL_LAYER = -1  # the post-norm final state's "layer" in stub_feature


def stub_feature(token: int, position: int, layer: int, dim: int) -> float:
    return math.sin(0.001 * (token + 1) * (dim + 1) + 0.1 * position + 0.37 * layer)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang_stub")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key")
    p.add_argument("--config")
    p.add_argument("--served-model-name")
    for name in (
        "--tp-size",
        "--dp-size",
        "--mem-fraction-static",
        "--context-length",
        "--chunked-prefill-size",
        "--cuda-graph-max-bs",
        "--cuda-graph-max-bs-decode",
        "--num-continuous-decode-steps",
        "--random-seed",
        "--log-level",
        "--dtype",
        "--attention-backend",
        "--sampling-backend",
        "--grammar-backend",
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--max-running-requests",
    ):
        p.add_argument(name)
    p.add_argument("--cuda-graph-bs", nargs="+")
    for name in (
        "--enable-return-hidden-states",
        "--disable-radix-cache",
        "--disable-cuda-graph",
        "--disable-custom-all-reduce",
        "--disable-prefill-cuda-graph",
        "--skip-server-warmup",
        "--enable-torch-compile",
    ):
        p.add_argument(name, action="store_true")
    return p


class Model:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        cfg_path = Path(args.model_path) / "config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        self.hidden = int(cfg.get("hidden_size", 8))
        self.vocab = int(cfg.get("vocab_size", 1000))
        self.eos = 2
        self.layer_ids: list[int] | None = None
        self.spec = args.speculative_algorithm == "EAGLE3"
        if self.spec:
            dcfg = json.loads((Path(args.speculative_draft_model_path) / "config.json").read_text())
            layers = int(cfg.get("num_hidden_layers", 8))
            ids = dcfg.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
            self.layer_ids = ids or [1, layers // 2 - 1, layers - 4]
        self.accept = int(os.environ.get("SGLANG_STUB_ACCEPT", "3"))
        self.step_s = float(os.environ.get("SGLANG_STUB_STEP_S", "0.0005"))
        self.seen: list[list[int]] = []
        self.lock = threading.Lock()
        self.verify_total = 0
        self.completion_total = 0
        self.posts = 0

    def tokens(self, text: str) -> list[int]:
        return [sum(map(ord, w)) % self.vocab for w in text.split()] or [1]

    def cached_prefix(self, ids: list[int]) -> int:
        if self.args.disable_radix_cache:
            return 0
        best = 0
        with self.lock:
            for prev in self.seen:
                n = 0
                while n < min(len(prev), len(ids) - 1) and prev[n] == ids[n]:
                    n += 1
                best = max(best, n)
            self.seen.append(list(ids))
        return best

    def hidden_rows(self, ids: list[int], start: int) -> list[list[float]]:
        rows = []
        for pos in range(start, len(ids)):
            tok = ids[pos]
            if self.layer_ids is None:
                rows.append([stub_feature(tok, pos, FINAL_LAYER, j) for j in range(self.hidden)])
            else:
                rows.append(
                    [
                        stub_feature(tok, pos, layer, j)
                        for layer in self.layer_ids
                        for j in range(self.hidden)
                    ]
                )
        return rows

    def run(self, ids: list[int], sp: dict, want_hidden: bool):
        """Yield (new_token_count_so_far, meta_info, done) per forward step."""
        max_new = int(sp.get("max_new_tokens", 16))
        ignore_eos = bool(sp.get("ignore_eos", False))
        # deterministic "answer" length: stops at eos after 5 + (sum % 20) tokens
        natural = 5 + sum(ids) % 20
        n_out = max_new if ignore_eos else min(max_new, natural)
        finish = (
            {"type": "length", "length": max_new}
            if n_out == max_new and (ignore_eos or natural >= max_new)
            else {"type": "stop", "matched": self.eos}
        )
        per_step = self.accept if self.spec else 1
        cached = self.cached_prefix(ids)
        t0 = time.monotonic()
        done_tokens, verify = 0, 0
        meta = {"prompt_tokens": len(ids), "cached_tokens": cached, "id": "stub"}
        if want_hidden:
            meta["hidden_states"] = [self.hidden_rows(ids, cached)]
        while done_tokens < n_out:
            time.sleep(self.step_s)
            if done_tokens == 0:
                done_tokens = 1  # the prefill produces the first token
            else:
                verify += 1
                done_tokens = min(n_out, done_tokens + per_step)
            m = dict(meta, completion_tokens=done_tokens, finish_reason=None)
            if self.spec:
                m["spec_verify_ct"] = verify
            yield done_tokens, m, False
        m = dict(
            meta, completion_tokens=n_out, finish_reason=finish, e2e_latency=time.monotonic() - t0
        )
        if self.spec:
            m["spec_verify_ct"] = verify
            m["spec_accept_length"] = n_out / max(verify, 1)
        with self.lock:
            self.verify_total += verify
            self.completion_total += n_out
        yield n_out, m, True

    def text_of(self, ids: list[int], n: int) -> tuple[list[int], str]:
        out = [(sum(ids) + 7 * i) % self.vocab for i in range(n)]
        return out, " ".join(f"w{t}" for t in out)


class Handler(BaseHTTPRequestHandler):
    model: Model
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep the job log readable
        sys.stdout.write("stub: " + (fmt % args) + "\n")
        sys.stdout.flush()

    def _json(self, obj, code: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _auth_ok(self) -> bool:
        key = self.model.args.api_key
        if self.path.startswith("/health") or not key:
            return True
        if self.headers.get("Authorization") != f"Bearer {key}":
            self._json({"error": "Unauthorized"}, 401)
            return False
        return True

    def do_GET(self):
        m = self.model
        if not self._auth_ok():
            return
        if self.path == "/health":
            self._json({})
        elif self.path == "/health_generate":
            if os.environ.get("SGLANG_STUB_NEVER_HEALTHY"):
                self._json({"error": "warming up"}, 503)
            else:
                self._json({})
        elif self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": self.served_name(), "object": "model"}]})
        elif self.path == "/model_info":
            self._json({"model_path": m.args.model_path, "is_generation": True})
        elif self.path in ("/server_info", "/get_server_info"):
            args = {k: v for k, v in vars(m.args).items() if k != "api_key"}
            avg = m.completion_total / m.verify_total if m.verify_total else None
            self._json(
                {
                    **args,
                    "version": "0.0.0-stub",
                    "device": "cpu (stub)",
                    "internal_states": [{"avg_spec_accept_length": avg}],
                }
            )
        else:
            self._json({"error": f"no route {self.path}"}, 404)

    def served_name(self) -> str:
        return self.model.args.served_model_name or self.model.args.model_path

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length", "0"))
        return json.loads(self.rfile.read(n) or b"{}")

    def do_POST(self):
        if not self._auth_ok():
            return
        die_after = os.environ.get("SGLANG_STUB_DIE_AFTER")
        if die_after is not None:
            with self.model.lock:
                self.model.posts += 1
                if self.model.posts > int(die_after):
                    os._exit(3)  # a crash: no answer, no cleanup
        body = self._body()
        if self.path == "/generate":
            self.generate(body)
        elif self.path == "/v1/chat/completions":
            self.chat(body)
        elif self.path == "/v1/completions":
            self.complete(body)
        else:
            self._json({"error": f"no route {self.path}"}, 404)

    def generate(self, body: dict) -> None:
        m = self.model
        want_hidden = bool(body.get("return_hidden_states"))
        if want_hidden and not m.args.enable_return_hidden_states:
            self._json({"error": "return_hidden_states needs --enable-return-hidden-states"}, 400)
            return
        if "input_ids" in body:
            ids = body["input_ids"]
            batch = isinstance(ids[0], list)
            seqs = ids if batch else [ids]
        else:
            text = body["text"]
            batch = isinstance(text, list)
            seqs = [m.tokens(t) for t in (text if batch else [text])]
        sp = body.get("sampling_params", {})
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            ids = seqs[0]
            for n, meta, _done in m.run(ids, sp, want_hidden):
                out, text = m.text_of(ids, n)
                chunk = {"text": text, "output_ids": out, "meta_info": meta}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True
            return
        outs = []
        for ids in seqs:
            *_, (n, meta, _done) = m.run(ids, sp, want_hidden)
            out, text = m.text_of(ids, n)
            outs.append({"text": text, "output_ids": out, "meta_info": meta})
        self._json(outs if batch else outs[0])

    def chat(self, body: dict) -> None:
        m = self.model
        prompt = " ".join(str(msg.get("content", "")) for msg in body.get("messages", []))
        ids = m.tokens(prompt)
        sp = {"max_new_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or 16}
        *_, (n, meta, _done) = m.run(ids, sp, False)
        _, text = m.text_of(ids, n)
        msg = {"role": "assistant", "content": text}
        if os.environ.get("SGLANG_STUB_REASONING"):
            msg["reasoning_content"] = f"thinking about {len(ids)} tokens"
        finish = meta["finish_reason"]["type"]
        self._json(
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion",
                "model": self.served_name(),
                "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                "usage": _usage(len(ids), n),
            }
        )

    def complete(self, body: dict) -> None:
        m = self.model
        prompt = body.get("prompt", "")
        # token ids pass as they are, like SGLang's input_ids; text goes through the tokenizer
        ids = list(prompt) if isinstance(prompt, list) else m.tokens(str(prompt))
        seeded = [*ids, int(body.get("seed") or 0)]  # another seed, another text
        sp = {"max_new_tokens": body.get("max_tokens") or 16}
        if body.get("stream"):
            self.stream_completion(seeded, sp, len(ids), body)
            return
        *_, (n, meta, _done) = m.run(seeded, sp, False)
        _, text = m.text_of(seeded, n)
        finish = meta["finish_reason"]["type"]
        self._json(
            {
                "id": "cmpl-stub",
                "object": "text_completion",
                "model": self.served_name(),
                "choices": [{"index": 0, "text": text, "finish_reason": finish}],
                "usage": _usage(len(ids), n),
            }
        )

    def stream_completion(self, seeded: list[int], sp: dict, n_prompt: int, body: dict) -> None:
        """OpenAI-style streaming: the text each step adds, then (include_usage) the usage."""
        m = self.model
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        sent, n = 0, 0
        for n, meta, done in m.run(seeded, sp, False):
            out, _ = m.text_of(seeded, n)
            piece = "".join(f" w{t}" for t in out[sent:])
            sent = n
            finish = meta["finish_reason"]["type"] if done else None
            choice = {"index": 0, "text": piece, "finish_reason": finish}
            self._event({"object": "text_completion", "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            self._event({"object": "text_completion", "choices": [], "usage": _usage(n_prompt, n)})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _event(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _with_config(argv: list[str]) -> list[str]:
    """argv with the `--config` file's flags before the command line's (SGLang's order)."""
    if "--config" not in argv:
        return argv
    import yaml  # the stub runs in specbuild's environment

    i = argv.index("--config")
    path = Path(argv[i + 1])
    if path.suffix not in (".yaml", ".yml"):
        raise SystemExit(f"Config file must be YAML format, got: {path.suffix}")
    flags = [a for k, v in yaml.safe_load(path.read_text()).items() for a in (f"--{k}", str(v))]
    return flags + argv[:i] + argv[i + 2 :]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(_with_config(sys.argv[1:] if argv is None else argv))
    code = os.environ.get("SGLANG_STUB_EXIT")
    if code:
        print(f"stub: failing at start with code {code} as asked", flush=True)
        return int(code)
    if os.environ.get("SGLANG_STUB_CHILD"):
        # like SGLang's scheduler/detokenizer processes: a child that ignores SIGTERM
        import subprocess

        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import signal, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
            ]
        )
    print(f"stub: server_args={args}", flush=True)  # SGLang prints its ServerArgs too
    # SGLang logs this per model runner once its KV pool is sized (target, then draft model)
    for _ in range(2 if args.speculative_algorithm else 1):
        time.sleep(float(os.environ.get("SGLANG_STUB_POOL_S", "0")))
        print("stub: Memory pool end. avail mem=1.00 GB", flush=True)
    Handler.model = Model(args)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")  # what the job pinned, for the tests
    print(
        f"stub: serving {args.model_path} on http://{args.host}:{args.port} "
        f"(CUDA_VISIBLE_DEVICES={gpus})",
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
