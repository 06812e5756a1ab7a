"""Launch, health-check and stop an SGLang server that a job owns.

Contract: the server binds 127.0.0.1 (unless configured otherwise) on a free port, is
health-checked before use (`/health_generate` runs one real decode step), writes its output
into the job's log through the `specbuild` logger, and is stopped, with every process it
spawned, when the job ends: normally, on an exception, on SIGTERM from Snakemake, or at
interpreter exit. A server that dies or never becomes healthy raises `ServerStartError` with
the tail of its output, so a bad flag shows up as a failed job, not as a hang.

Access: a server gets a random API key (`new_api_key`) that only the job's own clients know
(SGLang then answers 401 to anything but `/health*` without it), so another user on a shared
host cannot use or drive it. The key reaches the server in an owner-only file read through
SGLang's `--config` (`api-key: ...`), never on its command line, which every user of the host
can read (`ps`); the file is removed once the server is up. The key and every environment value
whose name looks secret (KEY, TOKEN, SECRET, PASSWORD) or whose value looks like a credential
(infra.credential_patterns: a token's format, a password in a URL) are masked as *** in the log
lines written here, the server's own output included (SGLang prints its server_args at start).

Flags come from config as a mapping (`{attention_backend: triton, disable_radix_cache: true}`)
and are rendered by `build_server_args`; `unknown_flags` checks them against the server's own
`--help`, because SGLang rejects unknown flags at start but a typo'd boolean in a sweep would
otherwise cost a full server start to find.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.engines import keepers
from specbuild.engines.gpus import startup_lock
from specbuild.engines.http import MASK, EngineUnavailable, HTTPError, get_json, open_url
from specbuild.infra.credential_patterns import (
    is_credential_name,
    looks_like_credential,
    looks_like_random_key,
)
from specbuild.infra.server_flags import LAUNCH_FLAGS, cli_flag, flag_like_value, reserved_flag

__all__ = [
    "ServerOptions",
    "ServerSpec",
    "SGLangServer",
    "ServerStartError",
    "build_server_args",
    "model_path_arg",
    "tp_size",
    "is_secret_name",
    "mask_env",
    "new_api_key",
    "unknown_flags",
    "launcher_help",
    "free_port",
    "resolve_launcher",
    "running_server",
]

log = logging.getLogger("specbuild")

DEFAULT_LAUNCHER = ("python", "-m", "sglang.launch_server")
TAIL_LINES = 60  # server output kept in memory for error messages
STOP_GRACE_S = 30.0  # SGLang's scheduler processes need a few seconds to free the GPU
API_KEY_BYTES = 32  # secrets.token_urlsafe: 43 characters, 256 random bits
# Environment names whose values are credentials (HF_TOKEN, OPENAI_API_KEY, WANDB_API_KEY...).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
# Values scrubbed from output lines are at least this long: TOKENIZERS_PARALLELISM=false
# names a "TOKEN" too, and masking every "false" would garble the server's log.
MIN_MASKED_CHARS = 8
# free_port() only finds a port free at that moment: another process (a parallel job, another
# user's server) may bind it before this server does. A server that fails so is restarted on
# another free port, this many times in all.
PORT_ATTEMPTS = 3
PORT_TAKEN = "Address already in use"
# SGLang 0.5.17 logs this once a model runner's KV pool is sized and allocated (target, then
# draft model): after it, another start on the GPU no longer changes this server's pool.
POOL_SIZED = "Memory pool end."


# the keepers' kind of a kept server (engines.kept_server)
KEEPER_KIND = "server"


def tp_size(server_args: Mapping[str, Any]) -> int:
    """GPUs one server or model runner of `server_args` takes: its tensor-parallel size, from
    `tp_size` or the CLI alias `tp` that sglang.server_args also accepts; 1 when neither."""
    return int(server_args.get("tp_size") or server_args.get("tp") or 1)


class ServerStartError(EngineUnavailable):
    """The server exited or never answered its health check; the message holds its output tail."""


OUT_OF_MEMORY = ("out of memory", "OutOfMemoryError", "Not enough memory")


def draft_pool_hint(server_args: Sequence[str], tail: str) -> str:
    """What to set when a speculative server ran out of memory with its KV pools unbounded:
    SGLang sizes the target's pool from mem_fraction_static, then asks for the draft's on top,
    which for a wide drafter (64 KV heads at hidden 7168) is tens of GB more (BENCHMARKS.md,
    "DeepSeek-V3 random target")."""
    if (
        "--speculative-algorithm" not in server_args
        or "--max-total-tokens" in server_args
        or not any(s in tail for s in OUT_OF_MEMORY)
    ):
        return ""
    return (
        "\nspecbuild: a speculative server sizes a KV pool for the target and then one for the "
        "draft; set sglang.server_args.max_total_tokens (e.g. 524288) to bound both"
    )


def new_api_key() -> str:
    """A fresh random API key for one server (from `secrets`, never logged).

    Hex, not URL-safe base64: a key starting with `-` is read by the server's argparse as
    another flag (`--api-key: expected one argument`), one server start in 32.
    """
    return secrets.token_hex(API_KEY_BYTES)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says its value is a credential: any name the
    config check refuses as one (AUTHORIZATION, DB_PASS), and, since masking too much only
    garbles a log line, any that merely contains KEY, TOKEN, SECRET or PASSWORD."""
    return bool(SECRET_NAME.search(name)) or is_credential_name(name)


def mask_env(env: Mapping[str, Any]) -> dict[str, str]:
    """`env` as it may appear in logs and tables: a value whose name says secret, or that
    looks like a credential or a random key whatever its name, is `***`."""
    return {
        k: MASK
        if is_secret_name(k) or looks_like_credential(str(v)) or looks_like_random_key(str(v))
        else str(v)
        for k, v in env.items()
    }


def _secret_values(env: Mapping[str, str], api_key: str | None) -> tuple[str, ...]:
    # by name, or by shape (DATABASE_URL's postgres://user:password@host, NGC_AUTH's nvapi-...)
    values = {str(v) for k, v in env.items() if is_secret_name(k) or looks_like_credential(v)}
    values.add(api_key or "")
    # longest first, so a secret containing another one is masked whole
    return tuple(sorted((v for v in values if len(v) >= MIN_MASKED_CHARS), key=len, reverse=True))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def resolve_launcher(launcher: Sequence[str]) -> list[str]:
    """The launch command; a leading `python` means the interpreter running this job, so the
    server sees the same site-packages (PYTHONPATH=/tmp/site on the GPU host)."""
    cmd = list(launcher)
    if not cmd:
        raise ValueError("sglang.launcher is empty; the default is python -m sglang.launch_server")
    if cmd[0] in ("python", "python3"):
        cmd[0] = interpreter()
    return cmd


def interpreter() -> str:
    """This interpreter under one name however it was started (`.venv/bin/python3` under make,
    `.venv/bin/python` under `python -m`): a script that records it (results/serve.sh) must not
    differ between the two."""
    exe = Path(sys.executable)
    plain = exe.with_name("python")
    if plain != exe and plain.exists() and os.path.samefile(plain, exe):
        return str(plain)
    return str(exe)


def build_server_args(options: Mapping[str, Any]) -> list[str]:
    """Render `{key: value}` as SGLang command-line flags, in the given order.

    true -> `--key`; false or null -> omitted (SGLang's booleans are store_true);
    a list -> `--key v1 v2 ...`; anything else -> `--key str(value)`. A key that is or
    abbreviates a flag every server command carries (LAUNCH_FLAGS), or a value argparse would
    read as a flag, is refused (the config check names them first: infra.server_flags).
    """
    args: list[str] = []
    faults = []
    for key, value in options.items():
        flag = cli_flag(key)
        launch = reserved_flag(key, LAUNCH_FLAGS)
        if launch:
            faults.append(f"{key}: {cli_flag(launch)} is set by specbuild itself")
            continue
        if flag_like_value(value):
            faults.append(f"{key}: its value starts with '-', which SGLang reads as a flag")
            continue
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            if not value:
                continue
            args.append(flag)
            args.extend(str(v) for v in value)
        elif isinstance(value, dict):
            args += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            args += [flag, str(value)]
    if faults:
        raise ValueError("bad sglang server_args: " + "; ".join(faults))
    return args


_HELP_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)")


def unknown_flags(args: Sequence[str], help_text: str) -> list[str]:
    """Flags in `args` that the server's `--help` text does not list (in order, no repeats)."""
    known = set(_HELP_FLAG.findall(help_text))
    out: list[str] = []
    for a in args:
        if a.startswith("--") and a.split("=", 1)[0] not in known and a not in out:
            out.append(a.split("=", 1)[0])
    return out


def launcher_help(launcher: Sequence[str], *, env: Mapping[str, str] | None = None) -> str:
    """The launcher's `--help` output (argparse prints every flag it accepts)."""
    proc = subprocess.run(
        [*resolve_launcher(launcher), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if proc.returncode != 0 or "--model-path" not in proc.stdout:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise ServerStartError(f"`{' '.join(launcher)} --help` failed ({proc.returncode}):\n{tail}")
    return proc.stdout


@dataclass(frozen=True)
class ServerSpec:
    """Everything that decides how one server is started (all plain values, from params)."""

    model_path: str
    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    server_args: tuple[str, ...] = ()  # rendered by build_server_args
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port
    startup_timeout_s: float = 900.0
    health_path: str = "/health_generate"
    # `--api-key` of the server (new_api_key()); its clients send it. None: an open server.
    api_key: str | None = field(default=None, repr=False)

    def key(self) -> str:
        """What makes two jobs' servers the same one (the API key and port do not): the keeper
        folder a kept server of this spec lives in (engines.kept_server)."""
        ident = {
            "model_path": model_path_arg(self.model_path),
            "launcher": list(self.launcher),
            "server_args": list(self.server_args),
            "env": dict(sorted(self.env.items())),
            "host": self.host,
        }
        return keepers.keeper_key(KEEPER_KIND, ident)


@dataclass(frozen=True)
class ServerOptions:
    """How every server specbuild starts is launched (config `sglang.*`): built once from
    config (`specbuild.workflow.engine_settings.sglang_server_options`), passed whole to each job,
    and turned into one server's `ServerSpec` here only."""

    launcher: tuple[str, ...] = DEFAULT_LAUNCHER
    server_args: Mapping[str, Any] = field(default_factory=dict)  # {flag_name: value}
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    startup_timeout_s: float = 900  # the schema's int: 900.0 would be another param
    request_timeout_s: float = 600  # one HTTP request to the server
    draft_attention_backend: str | None = None  # servers with a drafter: its attention kernels

    def spec(
        self,
        model_path: str | os.PathLike,
        *,
        extra_args: Mapping[str, Any] | None = None,
        extra_env: Mapping[str, Any] | None = None,
    ) -> ServerSpec:
        """One server of `model_path`: these flags and env plus `extra_*` (which win), on a
        free port, with a fresh API key."""
        env = {**self.env, **(extra_env or {})}
        return ServerSpec(
            model_path=str(model_path),
            launcher=tuple(self.launcher),
            server_args=tuple(build_server_args({**self.server_args, **(extra_args or {})})),
            env={k: str(v) for k, v in env.items()},
            host=self.host,
            startup_timeout_s=self.startup_timeout_s,
            api_key=new_api_key(),
        )


class SGLangServer:
    """One running server; use as a context manager (or `running_server`)."""

    def __init__(self, spec: ServerSpec, *, name: str = "sglang") -> None:
        self.spec = spec
        self.name = name
        self.port = spec.port or free_port(spec.host)
        self.proc: subprocess.Popen | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._reader: threading.Thread | None = None
        self._old_sigterm: Any = None
        self._env = {**os.environ, **{k: str(v) for k, v in spec.env.items()}}
        self._secrets = _secret_values(self._env, spec.api_key)
        self._pools_sized = 0  # POOL_SIZED lines seen in this start's output
        self._key_file: Path | None = None  # the API key's --config file while starting
        # seconds from start() to healthy, waits for another start on the GPUs included
        self.start_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def api_key(self) -> str | None:
        """The key every request to this server must carry (None: the server has none)."""
        return self.spec.api_key

    def mask(self, text: str) -> str:
        """`text` with the API key and secret-looking environment values replaced by ***."""
        for value in self._secrets:
            text = text.replace(value, MASK)
        return text

    def command(self) -> list[str]:
        """The server's argv: specbuild's own flags after the configured ones, so that the
        last value given, the one argparse keeps, is always specbuild's."""
        spec = self.spec
        return [
            *resolve_launcher(spec.launcher),
            *spec.server_args,
            cli_flag("model_path"),
            model_path_arg(spec.model_path),
            cli_flag("host"),
            spec.host,
            cli_flag("port"),
            str(self.port),
            *([cli_flag("config"), str(self._key_file)] if self._key_file else []),
        ]

    def output_tail(self) -> str:
        return "\n".join(self._tail)

    def _forward_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = self.mask(line.rstrip())
            self._tail.append(line)
            if POOL_SIZED in line:
                self._pools_sized += 1
            log.info("[%s] %s", self.name, line)

    def start(self) -> SGLangServer:
        """Start and wait until healthy; a port taken meanwhile is replaced (PORT_ATTEMPTS)."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self._start_once()
            except ServerStartError as err:
                if self.spec.port is not None or PORT_TAKEN not in str(err):
                    raise
                if attempt == PORT_ATTEMPTS:
                    raise
                log.warning(
                    "%s: port %d was taken before it bound; next port", self.name, self.port
                )
                self.port = free_port(self.spec.host)
                self._tail.clear()
        raise AssertionError("unreachable")

    def _pools_expected(self) -> int:
        # a speculative server sizes a pool for the target, then one for the draft model
        return 2 if "--speculative-algorithm" in self.spec.server_args else 1

    def _start_once(self) -> SGLangServer:
        if self.spec.api_key:
            self._key_file = _write_key_file(self.spec.api_key)
        try:
            return self._launch()
        finally:  # read at the server's start: gone once it is up (or failed)
            if self._key_file is not None:
                shutil.rmtree(self._key_file.parent, ignore_errors=True)
                self._key_file = None

    def _launch(self) -> SGLangServer:
        cmd = self.command()
        env_note = " ".join(f"{k}={v}" for k, v in sorted(mask_env(self.spec.env).items()))
        note = self.mask(f"{env_note} {' '.join(cmd)}".strip())
        t0 = time.monotonic()
        # an idle kept engine's memory on these GPUs is ours now, but not this spec's own
        keepers.release_idle(keep=self.spec.key())
        # One start at a time per GPU until the KV pools are sized: SGLang sizes them from the
        # memory free before and after loading the weights, and another start in between takes
        # its own share out of this one's count ("Loaded weights leave no GPU memory for the KV
        # cache"), as two `hidden` runners on one H200 did (BENCHMARKS.md).
        with startup_lock(self.name):
            log.info("starting %s: %s", self.name, note)
            # Its own process group (not a new session) lets stop() reach the scheduler and
            # detokenizer processes SGLang spawns, while a server orphaned by a SIGKILLed job
            # still belongs to the caller's session, which batch systems and terminals
            # clean up.
            self._pools_sized = 0
            self.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                env=self._env,
                process_group=0,
            )
            atexit.register(self.stop)
            self._reader = threading.Thread(target=self._forward_output, daemon=True)
            self._reader.start()
            try:
                healthy = self._wait_healthy(t0, until_sized=True)
            except BaseException:
                self.stop()
                raise
        if not healthy:
            try:
                self._wait_healthy(t0)
            except BaseException:
                self.stop()
                raise
        return self

    def _wait_healthy(self, t0: float, *, until_sized: bool = False) -> bool:
        """Wait until the server answers its health check (True) or, with `until_sized`,
        until its KV pools are sized (False, if that came first)."""
        assert self.proc is not None
        url = self.base_url + self.spec.health_path
        while time.monotonic() - t0 < self.spec.startup_timeout_s:
            code = self.proc.poll()
            if code is not None:
                self._drain()
                tail = self.output_tail()
                raise ServerStartError(
                    f"{self.name} exited with code {code} before it was healthy; "
                    f"its last output:\n{tail}{draft_pool_hint(self.spec.server_args, tail)}"
                )
            if until_sized and self._pools_sized >= self._pools_expected():
                return False
            try:
                with open_url(url, api_key=self.api_key, timeout=10) as r:
                    if r.status == 200:
                        # what this start cost, for the rows that compare starts (tuning)
                        self.start_s = round(time.monotonic() - t0, 2)
                        log.info(
                            "%s healthy at %s after %.1f s", self.name, self.base_url, self.start_s
                        )
                        return True
            except (HTTPError, urllib.error.URLError, OSError, TimeoutError):
                pass  # not up yet: refused, or up but not ready (503)
            time.sleep(0.5)
        raise ServerStartError(
            f"{self.name} not healthy at {url} within {self.spec.startup_timeout_s:.0f} s "
            f"(raise sglang.startup_timeout_s if the model is large); its last output:\n"
            f"{self.output_tail()}"
        )

    def _drain(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    def stop(self) -> int | None:
        """Stop the whole process group: SIGTERM, SIGKILL after a grace period, and return
        only once no process of the group is left, so the next server finds the GPU free."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            log.info("stopping %s (pid %d)", self.name, proc.pid)
        deadline = time.monotonic() + STOP_GRACE_S
        sig = signal.SIGTERM
        while _group_alive(proc.pid):
            if time.monotonic() > deadline:
                sig = signal.SIGKILL
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                proc.wait(timeout=0.5)  # reaps the launcher; children are reaped by init
            except subprocess.TimeoutExpired:
                pass
            if sig == signal.SIGKILL and time.monotonic() > deadline + 10:
                log.warning("%s: processes of group %d outlived SIGKILL", self.name, proc.pid)
                break
        proc.poll()
        self._drain()
        atexit.unregister(self.stop)
        return proc.returncode

    def __enter__(self) -> SGLangServer:
        # Snakemake stops jobs with SIGTERM; turn it into SystemExit so __exit__ runs.
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_system_exit)
        try:
            return self.start()
        except BaseException:
            self._restore_signal()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._restore_signal()

    def _restore_signal(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def get_json(self, path: str, timeout: float = 30.0) -> Any:
        """GET `path` of this server (with its API key) as JSON."""
        return get_json(self.base_url + path, api_key=self.api_key, timeout=timeout)


def model_path_arg(model_path: str) -> str:
    """`--model-path` of a server: a local folder as an absolute path, never mistaken for a hub
    id; anything else (a hub id) as given."""
    return str(Path(model_path).resolve()) if Path(model_path).exists() else model_path


def _write_key_file(api_key: str) -> Path:
    """An owner-only `--config` YAML file holding `api-key` (in a fresh 0700 directory), so the
    key is in no process's command line."""
    folder = Path(tempfile.mkdtemp(prefix="specbuild-key-"))
    path = folder / "key.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"api-key: {json.dumps(api_key)}\n")  # a JSON string is a YAML string
    return path


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_system_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def running_server(spec: ServerSpec, *, name: str = "sglang") -> Iterator[SGLangServer]:
    """`with running_server(spec) as srv:` — healthy on entry, stopped on exit."""
    with SGLangServer(spec, name=name) as srv:
        yield srv
