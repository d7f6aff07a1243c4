"""MODEL as an http(s) URL: only the header is fetched, by range requests from a server the tests
start on loopback, split parts are found beside the first, and the plan equals the local one."""
from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.make_gguf import write_gguf, write_split_gguf
from schedplan.cli.main import cli
from schedplan.cli.options import parse_params
from schedplan.planner import download
from schedplan.planner.reserve import reserve

MiB = 1 << 20


class RangeServer(ThreadingHTTPServer):
    """Serves a folder with HEAD and Range GETs, counting the body bytes handed to the socket per file; `mode`
    breaks it on purpose: "no-ranges" (answers 200 with everything), "truncated" (sends half a
    range and closes), "slow" (waits before answering)."""
    daemon_threads = True

    def __init__(self, root: Path):
        super().__init__(("127.0.0.1", 0), Handler)
        self.root, self.mode, self.sent = root, "ok", {}

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"


class Handler(BaseHTTPRequestHandler):
    server: RangeServer

    def log_message(self, *args) -> None:
        pass

    def _file(self):
        path = self.server.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return None
        if self.server.mode == "slow":
            time.sleep(3)
        return path

    def do_HEAD(self) -> None:
        path = self._file()
        if path is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("ETag", f'"{path.stat().st_mtime_ns}"')
        if self.server.mode != "no-ranges":
            self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        path = self._file()
        if path is None:
            return
        size = path.stat().st_size
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if m is None or self.server.mode == "no-ranges":
            start, end, status = 0, size - 1, 200
        else:
            start, end, status = int(m.group(1)), min(int(m.group(2)), size - 1), 206
        body_len = end - start + 1
        self.send_response(status)
        self.send_header("Content-Length", str(body_len))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        send = body_len // 2 if self.server.mode == "truncated" else body_len
        with open(path, "rb") as f:
            f.seek(start)
            remaining = send
            while remaining > 0:
                chunk = f.read(min(remaining, 1 << 16))
                # counted before the write: the client may read the last chunk and return before
                # this thread runs again, and the test reads `sent` right then
                self.server.sent[path.name] = self.server.sent.get(path.name, 0) + len(chunk)
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
                remaining -= len(chunk)
        if send < body_len:
            self.close_connection = True


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    srv = RangeServer(tmp_path / "www")
    (tmp_path / "www").mkdir()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def header_bytes(path: Path) -> int:
    from schedplan.planner.gguf import read_header
    return read_header(path).data_offset


def cli_error(*args) -> str:
    res = CliRunner().invoke(cli, ["reserve", *args])
    assert isinstance(res.exception, SystemExit) and res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    return lines[0]


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-qwen3moe"])
def test_url_plans_like_the_local_file_from_its_header_alone(server, name):
    local = write_gguf(name, server.root / f"{name}.gguf")       # the whole sparse file is served
    flags = parse_params(["-c", "4096", "-np", "2"])
    remote = reserve(server.url(local.name), flags)
    here = reserve(str(local), flags)
    for field in ("compute_buffers", "kv_buffers", "output_buffers", "model_buffers", "graphs"):
        assert remote[field] == here[field], field
    assert remote["model"]["path"] == server.url(local.name)
    assert server.sent[local.name] <= 2 * header_bytes(local) + MiB


def test_large_header_grows_the_ranges_within_twice_its_size(server):
    """gemma-3-12b: a 262K-token vocabulary makes a 5.7 MiB header; a 6.9 GB file is served."""
    local = write_gguf("gemma-3-12b", server.root / "gemma-3-12b.gguf")
    plan = reserve(server.url(local.name), parse_params(["-c", "4096"]))
    assert plan["model"]["n_vocab"] == 262208
    assert header_bytes(local) < server.sent[local.name] <= 2 * header_bytes(local) + MiB


def test_split_parts_are_found_beside_the_first_url(server):
    parts = write_split_gguf("tiny-deepseek3", server.root / "tiny-deepseek3", 3)
    whole = write_gguf("tiny-deepseek3", server.root / "whole.gguf", header_only=True)
    flags = parse_params(["-c", "2048"])
    remote, here = reserve(server.url(parts[0].name), flags), reserve(str(parts[0]), flags)
    assert remote["compute_buffers"] == here["compute_buffers"] == reserve(str(whole), flags)["compute_buffers"]
    assert remote["model_buffers"] == here["model_buffers"]
    for p in parts:
        assert 0 < server.sent[p.name] <= 2 * header_bytes(p) + MiB


def test_the_header_cache_answers_again_without_fetching_and_the_flag_bypasses_it(server):
    write_gguf("tiny-qwen3", server.root / "q.gguf")
    url = server.url("q.gguf")
    reserve(url, parse_params([]))
    first = server.sent["q.gguf"]
    reserve(url, parse_params([]))
    assert server.sent["q.gguf"] == first                    # HEAD only: no body bytes
    reserve(url, parse_params(["--no-header-cache"]))
    assert server.sent["q.gguf"] == 2 * first


def test_not_found(server):
    assert "not found (HTTP 404)" in cli_error(server.url("nope.gguf"))


def test_missing_split_part(server):
    parts = write_split_gguf("tiny-qwen3", server.root / "s", 2)
    parts[1].unlink()
    line = cli_error(server.url(parts[0].name))
    assert "failed to load GGUF split" in line and "HTTP 404" in line


def test_server_without_ranges_is_refused_before_any_body(server):
    write_gguf("tiny-qwen3", server.root / "q.gguf")
    server.mode = "no-ranges"
    assert "does not serve byte ranges" in cli_error(server.url("q.gguf"))
    assert server.sent.get("q.gguf", 0) == 0


def test_truncated_answer(server):
    write_gguf("tiny-qwen3", server.root / "q.gguf")
    server.mode = "truncated"
    line = cli_error(server.url("q.gguf"))
    assert "q.gguf" in line and ("truncated answer" in line or "broke off" in line)


def test_slow_server(server, monkeypatch):
    monkeypatch.setattr(download, "TIMEOUT_S", 0.5)
    write_gguf("tiny-qwen3", server.root / "q.gguf")
    server.mode = "slow"
    assert "no answer within 0.5 s" in cli_error(server.url("q.gguf"))
