"""Ground truth of what a real llama-server allocates over its life: every backend buffer, in order,
seen by an LD_PRELOAD library (buffer_log.c) that wraps ggml_backend_buft_alloc_buffer,
ggml_backend_dev_buffer_from_host_ptr and ggml_backend_buffer_free and attributes each buffer to
the llama API call it happened in (loading a model, creating context N, a decode on context N).

    life = serve(binary, args, requests=[{"prompt": "hi", "n_predict": 4}], library=build_buffer_log(...))
    live_buffers(life.events, life.listening)   # what it holds once it listens
    live_buffers(life.events, life.served)      # ... and after the requests, before it shuts down

serve starts llama-server (the args as given, plus --host/--port), waits until it listens, sends
each request to /completion in turn, then stops it (SIGTERM) and returns the events it logged.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

from .llama_cpp_run import RunError, compile_shared


@dataclasses.dataclass(frozen=True)
class Event:
    seq: int
    event: str          # alloc, map, free, begin, end
    scope: str          # model, ctxN, ctxN.decode, ctxN.encode, free.ctxN, - (outside them)
    buft: str
    size: int
    buffer: str
    stack: tuple[str, ...]

    @property
    def owner(self) -> str:
        """The allocating function inside the scope, from the stack (innermost first)."""
        for frame in self.stack:
            for key, name in STACK_OWNERS:
                if key in frame:
                    return name
        return "?"


# mangled names of the functions that allocate (src/llama-context.cpp, llama-kv-cache.cpp,
# llama-memory-recurrent.cpp, llama-model.cpp), innermost first in a stack
STACK_OWNERS = (
    ("output_reserve", "output"),
    ("sched_reserve", "compute"),
    ("ggml_backend_sched_alloc_graph", "compute"),
    ("ggml_gallocr", "compute"),
    ("llama_kv_cache", "kv"),
    ("llama_memory_recurrent", "rs"),
    ("load_tensors", "model"),
)


def build_buffer_log(include_dirs: list[Path]) -> Path:
    """buffer_log.c compiled once per source and llama.h (include_dirs: the llama.cpp source's
    include/ and ggml/include/)."""
    src = Path(__file__).with_name("buffer_log.c")
    header = next((d / "llama.h" for d in include_dirs if (d / "llama.h").exists()), None)
    if header is None:
        raise RunError("llama.h not found in " + ", ".join(map(str, include_dirs)))
    key = hashlib.sha256(src.read_bytes() + header.read_bytes()).hexdigest()[:16]
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    return compile_shared(src, f"libsp_buffer_log-{key}.so", cc, [f"-I{d}" for d in include_dirs],
                          ["-ldl", "-lpthread"], "the buffer-log library")


def parse(text: str) -> list[Event]:
    out = []
    for line in text.splitlines():
        seq, event, scope, buft, size, buffer, stack = line.split("\t")
        out.append(Event(int(seq), event, scope, buft, int(size), buffer,
                         tuple(stack.split(",")) if stack != "-" else ()))
    return out


@dataclasses.dataclass
class ServerLife:
    events: list[Event]
    log: str                    # llama-server's own log
    responses: list[dict]       # /completion's answers; a request the server died on: {"error": ...}
    listening: int              # the last event's seq when llama-server listened (-1: none yet)
    served: int                 # the last event's seq before it began to shut down


def serve(binary: Path, args: list[str], requests: list[dict], *, library: Path, env: Optional[dict] = None,
          timeout: float = 300) -> ServerLife:
    """Run llama-server with the buffer log, send the requests, stop it."""
    with tempfile.TemporaryDirectory() as tmp:
        events_path, log_path = Path(tmp) / "buffers.tsv", Path(tmp) / "server.log"
        run_env = dict(os.environ if env is None else env, LD_PRELOAD=str(library),
                       SCHEDPLAN_BUFFER_LOG=str(events_path))
        responses: list[dict] = []
        with open(log_path, "ab") as out:
            proc = subprocess.Popen([str(binary), *args, "--host", "127.0.0.1", "--port", "0"], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=run_env)
            try:
                port = wait_listening(proc, log_path, timeout)
                listening = _last_seq(events_path)
                if port is not None:
                    for request in requests:
                        try:
                            responses.append(_post(port, "/completion", request, timeout))
                        except OSError as e:      # the server died on it (an abort)
                            responses.append({"error": str(e)})
                            break
                served = _last_seq(events_path)
            finally:
                stop_server(proc)
        text = log_path.read_text(errors="replace")
        events = parse(events_path.read_text()) if events_path.exists() else []
    if port is None:
        raise RunError("llama-server did not start: " + "\n".join(text.splitlines()[-20:]))
    return ServerLife(events, text, responses, listening, served)


def _last_seq(path: Path) -> int:
    lines = path.read_text().splitlines() if path.exists() else []
    return int(lines[-1].split("\t", 1)[0]) if lines else -1


def wait_listening(proc: subprocess.Popen, log_path: Path, timeout: float) -> Optional[int]:
    """The port llama-server logs it listens on, once it does; None if it exits or times out first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        m = re.search(r"llama_server: listening on http://[\d.]+:(\d+)", log_path.read_text(errors="replace"))
        if m:
            return int(m.group(1))
        time.sleep(0.2)
    return None


def _post(port: int, path: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def live_buffers(events: list[Event], until: Optional[int] = None) -> dict[str, Event]:
    """The buffers alive after event number `until` (all events: None), by buffer address."""
    alive: dict[str, Event] = {}
    for e in events:
        if until is not None and e.seq > until:
            break
        if e.event in ("alloc", "map"):
            alive[e.buffer] = e
        elif e.event == "free":
            alive.pop(e.buffer, None)
    return alive
