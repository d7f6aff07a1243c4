"""A model's header over HTTP(S), before (instead of) downloading the model: range requests that
grow only as far as the header needs, kept in a small on-disk cache keyed by URL and ETag (or size).

The remote side of common/download.cpp (common_remote_get_content), for headers only. Split models
find their other parts beside the first URL, by the same names as on disk (planner/split.py).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .gguf import GGUFError, GGUFHeader, read_header

FIRST_CHUNK = 1 << 20         # the first request; each next one doubles what is held
TIMEOUT_S = 30.0              # connect and read timeout of each request


class RemoteError(GGUFError):
    """A URL whose header cannot be fetched: one line, with the reason."""


def is_url(path) -> bool:
    return isinstance(path, str) and path.startswith(("http://", "https://"))


def read_model_header(path, use_cache: bool = True) -> GGUFHeader:
    """read_header for a local path, or for an http(s) URL through the header cache."""
    return read_remote_header(path, use_cache) if is_url(path) else read_header(path)


def common_get_model_endpoint() -> str:
    """common/common.cpp: MODEL_ENDPOINT, else HF_ENDPOINT, else the Hub; always ending in '/'."""
    endpoint = os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT") or "https://huggingface.co/"
    return endpoint if endpoint.endswith("/") else endpoint + "/"


def bearer_headers(url: str) -> dict[str, str]:
    """HF_TOKEN as the Authorization of a file's requests. llama.cpp sends it with every download
    (common_download_file_single_online, bearer_token); schedplan only to URLs under the model
    endpoint, so that a URL naming another server never receives the token. (requests drops it
    on a redirect to another host, such as the Hub's to its storage.)"""
    token = os.environ.get("HF_TOKEN", "")
    return {"Authorization": f"Bearer {token}"} if token and url.startswith(common_get_model_endpoint()) else {}


def header_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "schedplan" / "headers"


def read_remote_header(url: str, use_cache: bool = True) -> GGUFHeader:
    import hashlib    # these only here: a local plan never pays their import
    import requests

    with requests.Session() as session:
        session.headers.update(bearer_headers(url))
        total, etag = _probe(session, url)
        key = hashlib.sha256(f"{url}\n{etag or total}".encode()).hexdigest()[:24]
        cached = header_cache_dir() / f"{key}.gguf"
        if use_cache and cached.is_file():
            return _named(read_header(cached), url, total)
        prefix = bytearray()
        while True:
            want = min(total, max(FIRST_CHUNK, 2 * len(prefix)))
            prefix += _get_range(session, url, len(prefix), want, total)
            header = _try_parse(prefix, url, total)
            if header is not None:
                break
        _store(cached, bytes(prefix))
        return _named(read_header(cached), url, total)


def _probe(session, url: str) -> tuple[int, Optional[str]]:
    """HEAD (redirects followed): the size, the ETag, and whether byte ranges are served."""
    r = request(session.head, url, allow_redirects=True)
    _check_status(r, url)
    if r.headers.get("Accept-Ranges", "").lower() != "bytes":
        raise RemoteError(f"{url}: the server does not serve byte ranges (Accept-Ranges: bytes), so only "
                          f"downloading the whole file could read its header")
    try:
        total = int(r.headers["Content-Length"])
    except (KeyError, ValueError):
        raise RemoteError(f"{url}: the server gives no Content-Length") from None
    return total, r.headers.get("ETag")


def _get_range(session, url: str, start: int, end: int, total: int) -> bytes:
    """Bytes [start, end) as a 206 answer; anything else is one line, never the whole file."""
    r = request(session.get, url, headers={"Range": f"bytes={start}-{end - 1}"}, stream=True)
    with r:
        _check_status(r, url)
        if r.status_code != 206:
            raise RemoteError(f"{url}: asked for bytes {start}-{end - 1}, the server answered {r.status_code} "
                              f"without a range (it ignores Range requests)")
        try:
            data = r.raw.read(end - start + 1, decode_content=True)
        except Exception as e:   # urllib3's protocol and read errors
            raise RemoteError(f"{url}: the answer broke off ({type(e).__name__})") from None
    if len(data) != end - start:
        raise RemoteError(f"{url}: truncated answer: {len(data)} bytes of the {end - start} asked for at "
                          f"offset {start} (file of {total} bytes)")
    return data


def request(method, url: str, **kwargs):
    import requests

    try:
        return method(url, timeout=TIMEOUT_S, **kwargs)
    except requests.Timeout:
        raise RemoteError(f"{url}: no answer within {TIMEOUT_S:g} s") from None
    except requests.RequestException as e:
        raise RemoteError(f"{url}: {type(e).__name__}: {str(e)[:200]}") from None


def _check_status(r, url: str) -> None:
    if r.status_code == 404:
        raise RemoteError(f"{url}: not found (HTTP 404)")
    if r.status_code in (401, 403) and url.startswith(common_get_model_endpoint()):
        hint = ("HF_TOKEN was sent: does it grant access to this file?" if "Authorization" in r.request.headers
                else "a gated or private file needs HF_TOKEN")
        raise RemoteError(f"{url}: HTTP {r.status_code} ({hint})")
    if r.status_code >= 400:
        raise RemoteError(f"{url}: HTTP {r.status_code}")


def _try_parse(prefix: bytearray, url: str, total: int) -> Optional[GGUFHeader]:
    """The header if the prefix holds all of it; None if it ends inside the header and the file
    goes on (fetch more); the reader's error otherwise."""
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(prefix)
        f.flush()
        try:
            return read_header(f.name)
        except GGUFError as e:
            if len(prefix) < total and ("truncated file" in str(e) or "does not fit in the file" in str(e)
                                        or "absurd" in str(e)):
                return None
            raise RemoteError(str(e).replace(f.name, url)) from None


def _store(path: Path, data: bytes) -> None:
    import tempfile
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)   # atomic: a concurrent plan sees a whole header or none


def _named(header: GGUFHeader, url: str, total: int) -> GGUFHeader:
    """The header as the URL's: its name (for messages and split parts) and the remote file's size."""
    header.path, header.file_size = url, total
    return header
