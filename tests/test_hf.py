"""-hf USER/MODEL[:QUANT], -hff FILE and -mu URL: the file llama.cpp would download is picked as
common/download.cpp picks it, from the repository's file list as common/hf-cache.cpp reads it from
the Hub's API, and planned from its header alone. A loopback server fakes the Hub: the API's refs
and tree, and the files under /USER/MODEL/resolve/COMMIT/ with Range support."""
from __future__ import annotations

import hashlib
import json
import threading

import pytest
from click.testing import CliRunner

from fixtures.make_gguf import write_gguf, write_split_gguf
from fixtures.make_mmproj import config_names as projector_names, write_mmproj
from schedplan.cli.main import cli
from schedplan.planner import download
from schedplan.planner.hf import HfFile, find_best_model, is_valid_hf_token, is_valid_repo_id
from test_remote import Handler, RangeServer, header_bytes

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_" + "A1b2" * 9          # 39 characters: a token as llama.cpp's is_valid_hf_token accepts it
MiB = 1 << 20


class HubServer(RangeServer):
    """The Hub's endpoints llama.cpp uses. Each repository's files lie under
    root/USER/MODEL/resolve/COMMIT/, listed in `repos[repo]` order (the API's order). With `token`
    set, every request must carry it as a Bearer token (401 otherwise); `requests` records each
    request's method, path and Authorization header."""

    def __init__(self, root):
        super().__init__(root)
        self.RequestHandlerClass = HubHandler
        self.repos: dict[str, list[str]] = {}
        self.token: str | None = None
        self.requests: list[tuple[str, str, str | None]] = []

    def add(self, repo: str, files: dict[str, str | None]) -> dict[str, str]:
        """Files of a repository, in the API's order: path -> fixture config (None: a small non-GGUF
        file; a path ending in -00001-of-0000N.gguf writes all N parts; a projector fixture's name
        writes that projector). Returns path -> local file."""
        base = self.root / repo / "resolve" / COMMIT
        local, listed = {}, []
        for path, config in files.items():
            (base / path).parent.mkdir(parents=True, exist_ok=True)
            if config is None:
                (base / path).write_text("not a model\n")
                listed.append(path)
            elif "-00001-of-" in path:
                n = int(path[-10:-5])
                parts = write_split_gguf(config, base / path[:-len("-00001-of-00003.gguf")], n)
                listed += [str(p.relative_to(base)) for p in parts]
            else:
                (write_mmproj if config in projector_names() else write_gguf)(config, base / path)
                listed.append(path)
            local[path] = str(base / path)
        self.repos[repo] = listed
        return local

    def resolve_url(self, repo: str, path: str) -> str:
        return self.url(f"{repo}/resolve/{COMMIT}/{path}")


class HubHandler(Handler):
    server: HubServer

    def _json(self, status: int, doc) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization")
        self.server.requests.append((self.command, self.path, auth))
        if self.server.token is None or auth == f"Bearer {self.server.token}":
            return True
        self._json(401, {"error": "Invalid credentials in Authorization header"})
        return False

    def do_HEAD(self) -> None:
        if self._authorized():
            super().do_HEAD()

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if not self.path.startswith("/api/models/"):
            return super().do_GET()
        for repo, files in self.server.repos.items():
            if self.path == f"/api/models/{repo}/refs":
                return self._json(200, {"branches": [{"name": "main", "ref": "refs/heads/main",
                                                      "targetCommit": COMMIT}], "converts": [], "tags": []})
            if self.path == f"/api/models/{repo}/tree/{COMMIT}?recursive=true":
                dirs = sorted({p.rsplit("/", 1)[0] for p in files if "/" in p})
                return self._json(200, [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in dirs]
                                  + [{"type": "file", "oid": hashlib.sha1(p.encode()).hexdigest(), "size": 1, "path": p}
                                     for p in files])   # llama.cpp keeps blobs by oid: one per file
        self._json(404, {"error": "Repository not found"})


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("MODEL_ENDPOINT", raising=False)
    (tmp_path / "hub").mkdir()
    srv = HubServer(tmp_path / "hub")
    monkeypatch.setenv("HF_ENDPOINT", srv.url(""))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


def plan(*args) -> dict:
    res = invoke("reserve", "--json", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def one_line_error(*args) -> str:
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    return lines[0]


def same_plan(a: dict, b: dict) -> None:
    for field in ("compute_buffers", "kv_buffers", "output_buffers", "model_buffers", "graphs", "params"):
        assert a[field] == b[field], field


REPO = {"README.md": None, "mmproj-model-f16.gguf": "tiny-mmproj-gemma3", "model-Q8_0.gguf": "tiny-gemma3",
        "model-Q4_K_M.gguf": "tiny-qwen3", "model-imatrix.gguf": "tiny-gemma3"}


def test_hf_plans_the_file_llama_cpp_picks_as_the_local_file_from_its_header_alone(hub):
    local = hub.add("ggml-org/tiny-GGUF", REPO)
    remote = plan("-hf", "ggml-org/tiny-GGUF", "-c", "4096", "-np", "2")   # no tag: Q4_K_M
    same_plan(remote, plan(local["model-Q4_K_M.gguf"], "-c", "4096", "-np", "2"))
    assert remote["model"]["path"] == hub.resolve_url("ggml-org/tiny-GGUF", "model-Q4_K_M.gguf")
    name = f"ggml-org/tiny-GGUF/resolve/{COMMIT}/model-Q4_K_M.gguf"
    assert set(hub.sent) == {"model-Q4_K_M.gguf", "mmproj-model-f16.gguf"}    # no other file's bytes
    assert hub.sent["model-Q4_K_M.gguf"] <= 2 * header_bytes(hub.root / name) + MiB
    api = [path for method, path, _ in hub.requests if path.startswith("/api/")]
    assert api == ["/api/models/ggml-org/tiny-GGUF/refs", f"/api/models/ggml-org/tiny-GGUF/tree/{COMMIT}?recursive=true"]


def test_hf_loads_the_projector_beside_the_model_as_llama_server_does(hub):
    """llama-server's -hf downloads the repository's mmproj-*.gguf (find_best_mmproj) and loads it:
    planned from its header, as -mm of the local file plans it; --no-mmproj or -mm keeps it out."""
    local = hub.add("u/vl", REPO)
    remote = plan("-hf", "u/vl", "-c", "4096")
    assert remote["projector"]["path"] == hub.resolve_url("u/vl", "mmproj-model-f16.gguf")
    mm = plan(local["model-Q4_K_M.gguf"], "-c", "4096", "-mm", local["mmproj-model-f16.gguf"])["projector"]
    assert remote["projector"]["memory_usage"] == mm["memory_usage"] and remote["projector"]["encoders"] == mm["encoders"]
    hub.sent.clear()
    assert "projector" not in plan("-hf", "u/vl", "-c", "4096", "--no-mmproj", "--no-header-cache")
    assert set(hub.sent) == {"model-Q4_K_M.gguf"}


@pytest.mark.parametrize("tag, picked", [("q4_k_m", "model-Q4_K_M.gguf"), ("Q8_0", "model-Q8_0.gguf"),
                                         ("q8_0", "model-Q8_0.gguf"), ("", "model-Q4_K_M.gguf")])
def test_the_tag_is_matched_case_insensitively(hub, tag, picked):
    hub.add("u/m", REPO)
    assert plan("-hf", f"u/m:{tag}" if tag else "u/m")["model"]["path"] == hub.resolve_url("u/m", picked)


def test_a_split_model_is_planned_from_its_first_part_with_the_others_beside_it(hub):
    local = hub.add("u/big-GGUF", {"Q8_0/big-Q8_0.gguf": "tiny-qwen3",
                                   "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf": "tiny-deepseek3"})
    # the API lists the parts in name order; the first part is chosen whatever the order
    hub.repos["u/big-GGUF"].sort(reverse=True)
    remote = plan("-hf", "u/big-GGUF:Q4_K_M", "-c", "2048")
    assert remote["model"]["path"] == hub.resolve_url("u/big-GGUF", "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf")
    same_plan(remote, plan(local["Q4_K_M/big-Q4_K_M-00001-of-00003.gguf"], "-c", "2048"))
    assert sorted(hub.sent) == [f"big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_hff_names_the_file_and_overrides_the_tag(hub):
    hub.add("u/m", REPO)
    assert plan("-hf", "u/m:Q8_0", "-hff", "model-Q4_K_M.gguf")["model"]["path"] == \
        hub.resolve_url("u/m", "model-Q4_K_M.gguf")


def test_mu_is_a_url_model(hub):
    local = hub.add("u/m", REPO)
    url = hub.resolve_url("u/m", "model-Q8_0.gguf")
    same_plan(plan("-mu", url), plan(local["model-Q8_0.gguf"]))


def test_hf_token_is_sent_with_the_api_calls_and_the_range_requests(hub, monkeypatch):
    hub.add("u/gated", REPO)
    hub.token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    plan("-hf", "u/gated:Q8_0")
    methods = {method for method, _, _ in hub.requests}
    assert methods == {"GET", "HEAD"} and len(hub.requests) >= 4
    assert all(auth == f"Bearer {TOKEN}" for _, _, auth in hub.requests)


def test_without_hf_token_a_gated_repository_is_one_line(hub):
    hub.add("u/gated", REPO)
    hub.token = TOKEN
    line = one_line_error("reserve", "-hf", "u/gated")
    assert "GET failed (401): Invalid credentials" in line and "needs HF_TOKEN" in line


def test_a_token_llama_cpp_would_not_send_to_the_api_is_not_sent(hub, monkeypatch):
    """hf-cache.cpp api_get sends only tokens that look like one (is_valid_hf_token)."""
    hub.add("u/gated", REPO)
    hub.token = "not-a-token"
    monkeypatch.setenv("HF_TOKEN", "not-a-token")
    assert "HF_TOKEN was not sent" in one_line_error("reserve", "-hf", "u/gated")
    assert hub.requests[0][2] is None


def test_a_gated_file_without_token_is_one_line(hub):
    """The API may list a gated repository's files; its files answer 401 without a token."""
    hub.add("u/gated", REPO)
    hub.token = TOKEN
    line = one_line_error("reserve", "-mu", hub.resolve_url("u/gated", "model-Q8_0.gguf"))
    assert "HTTP 401 (a gated or private file needs HF_TOKEN)" in line


@pytest.mark.parametrize("args, message", [
    (["-hf", "nobody/nothing"], "GET failed (404): Repository not found"),
    (["-hf", "u/m:Q2_K"], "no GGUF file matching the tag Q2_K in repository u/m"),
    (["-hf", "u/m", "-hff", "model-Q2_K.gguf"], "file 'model-Q2_K.gguf' not found in repository u/m"),
    (["-hf", "u/m/x"], "invalid HF repo format"),
    (["-hf", "u/.m"], "invalid repository: u/.m"),
    (["-hf", "u/preset"], "u/preset has a preset.ini"),
])
def test_what_does_not_resolve_is_one_line(hub, args, message):
    hub.add("u/m", REPO)
    hub.add("u/preset", {"preset.ini": None, "model-Q4_K_M.gguf": "tiny-qwen3"})
    line = one_line_error("reserve", *args)
    assert message in line
    if "-hff" in args or ":Q2_K" in args[1]:
        assert "its GGUF files: mmproj-model-f16.gguf, model-Q8_0.gguf, model-Q4_K_M.gguf" in line


@pytest.mark.parametrize("command", ["run", "verify"])
def test_run_and_verify_refuse_a_remote_model_naming_the_file_to_download(hub, command):
    hub.add("u/m", REPO)
    line = one_line_error(command, "-hf", "u/m")
    assert hub.resolve_url("u/m", "model-Q4_K_M.gguf") in line and "download" in line
    assert hub.sent == {}


def test_every_planning_command_takes_hf(hub, tmp_path):
    local = hub.add("u/m", REPO)
    base = str(tmp_path / "base.json")
    assert invoke("baseline", "-hf", "u/m", "-c", "2048", "-o", base).exit_code == 0
    res = invoke("check", "-hf", "u/m", "-c", "2048", "--baseline", base)
    assert res.exit_code == 0 and "PASS" in res.output
    res = invoke("compare", "-hf", "u/m", local["model-Q4_K_M.gguf"], "--json")   # the positional is MODEL_B
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["a"]["label"] == hub.resolve_url("u/m", "model-Q4_K_M.gguf")
    assert doc["b"]["label"] == local["model-Q4_K_M.gguf"]
    assert all(row["delta"] == 0 for row in doc["buffers"])
    res = invoke("plot", "-hf", "u/m", "-o", str(tmp_path / "t.png"))
    assert res.exit_code == 0, res.output


def test_a_manifest_model_may_be_a_url(hub, tmp_path):
    hub.add("u/m", REPO)
    url = hub.resolve_url("u/m", "model-Q8_0.gguf")
    assert invoke("baseline", url, "-o", str(tmp_path / "b.json")).exit_code == 0
    (tmp_path / "m.json").write_text(json.dumps([{"model": url, "baseline": "b.json"}]))
    res = invoke("check", "--manifest", str(tmp_path / "m.json"))
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("args, message", [
    (["reserve"], "missing MODEL"),
    (["reserve", "m.gguf", "-hf", "u/m"], "MODEL and -hf each name the model"),
    (["reserve", "-mu", "http://h/m.gguf", "-hf", "u/m"], "-mu and -hf each name the model"),
    (["reserve", "-hff", "m.gguf"], "-hff names a file of the -hf repository: give -hf too"),
    (["reserve", "-mu", "m.gguf"], "'m.gguf' is not an http(s) URL"),
])
def test_the_model_is_named_once(args, message):
    assert message in one_line_error(*args)


# --- find_best_model (common/download.cpp) on file lists --------------------------------------

def best(paths: list[str], tag: str) -> str | None:
    f = find_best_model([HfFile(p, "") for p in paths], tag)
    return f and f.path


def test_without_a_tag_q4_k_m_then_q8_0_then_the_first_model_file():
    assert best(["m-Q8_0.gguf", "m-Q4_K_M.gguf"], "") == "m-Q4_K_M.gguf"
    assert best(["m-F16.gguf", "m-Q8_0.gguf"], "") == "m-Q8_0.gguf"
    assert best(["README.md", "mmproj-m-F16.gguf", "m-imatrix.gguf", "mtp-m-Q6_K.gguf", "m-Q6_K-00002-of-00002.gguf",
                 "m-Q6_K-00001-of-00002.gguf", "m-F16.gguf"], "") == "m-Q6_K-00001-of-00002.gguf"
    assert best(["README.md", "mmproj-m-F16.gguf"], "") is None


def test_the_tag_is_a_case_insensitive_pattern_followed_by_a_dot_or_a_dash():
    assert best(["m-Q4_K_M.gguf"], "q4_k_m") == "m-Q4_K_M.gguf"
    assert best(["m-Q4_K_M.gguf"], "Q4_K") is None           # followed by '_': no match, and no fallback
    assert best(["m-Q4_K_S.gguf", "m-Q4_K_M.gguf"], "Q4_K_[MS]") == "m-Q4_K_S.gguf"
    # a search, not a whole-name match, as llama.cpp's regex_search: IQ4_XS contains Q4_XS
    assert best(["m-IQ4_XS.gguf", "m-Q4_XS.gguf"], "Q4_XS") == "m-IQ4_XS.gguf"
    assert best(["Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf"], "Q4_K_M") == \
        "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf"


def test_endpoint_and_token_checks_as_llama_cpp(monkeypatch):
    monkeypatch.delenv("MODEL_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert download.common_get_model_endpoint() == "https://huggingface.co/"
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror:8080")
    assert download.common_get_model_endpoint() == "http://mirror:8080/"
    monkeypatch.setenv("MODEL_ENDPOINT", "http://models/")
    assert download.common_get_model_endpoint() == "http://models/"
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert download.bearer_headers("http://models/u/m/resolve/main/m.gguf") == {"Authorization": f"Bearer {TOKEN}"}
    assert download.bearer_headers("http://elsewhere/m.gguf") == {}          # the token stays with the Hub
    assert is_valid_hf_token(TOKEN) and not is_valid_hf_token("hf_short") and not is_valid_hf_token("x" * 40)
    assert is_valid_repo_id("ggml-org/Qwen3-0.6B-GGUF") and not is_valid_repo_id("u//m")
    assert not is_valid_repo_id("u/m-") and not is_valid_repo_id("u/m/x")


def test_fit_ranks_several_repositories(hub):
    """fit -hf A -hf B: each the file llama.cpp's -hf picks (with the projector it picks beside it,
    fitted as llama-server fits it), the same row as its local copy's fit; a repository that does
    not resolve is a row with its reason; the llama-server form plans -hf too."""
    local = hub.add("u/m", REPO)
    other = hub.add("v/n", {"n-Q8_0.gguf": "tiny-llama"})
    flags = ["--device", "cuda:64MiB:cc=8.9", "--host-memory", "16GiB", "-fitt", "0", "-c", "2048"]
    res = invoke("fit", "-hf", "u/m", "-hf", "v/n:q8_0", "-hf", "u/missing", *flags, "--json")
    assert res.exit_code == 0, res.output
    rows = {row["model"]: row for row in json.loads(res.stdout)}
    assert "error" in rows["u/missing"]
    for repo, args in (("u/m", [local["model-Q4_K_M.gguf"], "-mm", local["mmproj-model-f16.gguf"]]),
                       ("v/n:q8_0", [other["n-Q8_0.gguf"]])):
        alone = json.loads(invoke("fit", *args, *flags, "--json").stdout)
        assert {k: v for k, v in rows[repo].items() if k not in ("model", "projector", "server_args")} == \
            {k: v for k, v in alone.items() if k not in ("model", "projector", "server_args")}
    assert rows["u/m"]["projector"]["path"] == hub.resolve_url("u/m", "mmproj-model-f16.gguf")
    assert rows["u/m"]["server_args"].startswith("llama-server -hf u/m -fitt 0 -c 2048")
    res = invoke("fit", "--device", "cuda:64MiB:cc=8.9", "--json", "--", "llama-server", "-hf", "u/m", "-fitt", "0",
                 "-c", "2048")
    assert json.loads(res.stdout)["args"] == rows["u/m"]["args"]


@pytest.fixture(scope="session")
def llama_server_binary():
    """The reference build's llama-server, found before `hub` moves XDG_CACHE_HOME (where the build lives)."""
    from fixtures.server_fit_golden import binary
    return binary()


@pytest.mark.live
@pytest.mark.parametrize("devices", [(20, 20), (14, 14, 14)], ids=["20_20MiB", "14_14_14MiB"])
def test_fit_hf_equals_the_real_llama_server_hf(llama_server_binary, hub, tmp_path, monkeypatch, devices):
    """`fit -- llama-server -hf REPO:TAG` against the real llama-server given the same command: the
    server downloads the model its tag picks and the repository's mmproj-*.gguf from the same fake
    Hub (HF_ENDPOINT), then fits them on RPC servers reporting the budgets; schedplan plans the
    same files from their headers and must choose as the server did (targets, context, each layer's
    device, the projector's bytes)."""
    from fixtures.server_fit_golden import MiB as MIB, parse_log, run_server
    from schedplan.backends.rpc_server import rpc_servers
    from schedplan.cli.fit import fit
    from test_server_fit import check

    hub.add("u/vl", REPO)
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama-cache"))   # llama-server's download cache
    flags = ["-hf", "u/vl:Q8_0", "-fitt", "4"]
    with rpc_servers(len(devices), memory=[(d * MIB, (d + 2048) * MIB) for d in devices]) as endpoints:
        rpc = ["--rpc", ",".join(endpoints)]
        real = parse_log(run_server([str(llama_server_binary), *rpc, *flags, "--fit", "on", "-v", "--host", "127.0.0.1",
                                     "--port", "0"]))
        res = CliRunner().invoke(fit, ["--device", "none", "--json", "--", "llama-server", *rpc, *flags])
    assert real["fit"] is not None and real["mmproj_added"], real    # the server fitted, with the projector
    assert res.exit_code in (0, 1), res.output
    check(json.loads(res.stdout), real, {"projector": "mmproj-model-f16.gguf"})   # -hf loads the repository's
