"""Split GGUFs (llama-gguf-split parts): the model is read from its first part as llama.cpp reads it,
the plan equals the whole file's and real llama.cpp's, and every wrong set of parts is one line."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.make_gguf import write_gguf, write_split_gguf
from schedplan.cli.main import cli
from schedplan.cli.options import parse_params
from schedplan.planner.reserve import reserve
from schedplan.planner.split import list_splits, llama_split_prefix

SAME = ["compute_buffers", "kv_buffers", "output_buffers"]


def parts(tmp_path: Path, name: str, n: int, header_only: bool = True) -> list[Path]:
    (tmp_path / name).mkdir(exist_ok=True)
    return write_split_gguf(name, tmp_path / name / name, n, header_only=header_only)


def error_line(*args) -> str:
    res = CliRunner().invoke(cli, ["reserve", *map(str, args)])
    assert isinstance(res.exception, SystemExit) and res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    return lines[0]


def test_split_names_as_llama_cpp_builds_them():
    assert list_splits("/m/q-00001-of-00003.gguf", 0, 3) == [
        "/m/q-00001-of-00003.gguf", "/m/q-00002-of-00003.gguf", "/m/q-00003-of-00003.gguf"]
    assert llama_split_prefix("/m/q-00002-of-00003.gguf", 1, 3) == "/m/q"
    assert llama_split_prefix("/m/q.gguf", 0, 3) is None
    with pytest.raises(ValueError, match="invalid split file name"):
        list_splits("/m/q.gguf", 0, 3)


@pytest.mark.parametrize("name,n", [("tiny-qwen3", 3), ("tiny-gemma3", 2), ("tiny-deepseek3", 4)])
@pytest.mark.parametrize("flags", [["-c", "2048"], ["-c", "4096", "-np", "4", "-fa", "off"]])
def test_split_plans_like_the_whole_file(tmp_path, name, n, flags):
    whole = write_gguf(name, tmp_path / f"{name}.gguf", header_only=True)
    first = parts(tmp_path, name, n)[0]
    a, b = reserve(str(whole), parse_params(flags)), reserve(str(first), parse_params(flags))
    for field in SAME:
        assert a[field] == b[field], field
    for graph in ("pp", "tg"):
        assert a["graphs"][graph] == b["graphs"][graph]
    # one mapped buffer per part, each covering that part's tensors: never more than the whole file's
    assert 0 < b["model_buffers"]["CPU_Mapped"] <= a["model_buffers"]["CPU_Mapped"]


def test_a_later_part_names_the_first(tmp_path):
    p = parts(tmp_path, "tiny-qwen3", 3)
    line = error_line(p[1])
    assert "must be loaded with the first split" in line and str(p[0]) in line


def test_missing_part(tmp_path):
    p = parts(tmp_path, "tiny-qwen3", 3)
    p[2].unlink()
    line = error_line(p[0])
    assert "failed to load GGUF split" in line and str(p[2]) in line and "missing" in line


def test_part_in_the_wrong_place(tmp_path):
    """The third part copied over the second: it says it is part 3."""
    p = parts(tmp_path, "tiny-qwen3", 3)
    shutil.copy(p[2], p[1])
    line = error_line(p[0])
    assert "invalid split file idx: 2" in line and "expected 1" in line and str(p[1]) in line


def test_tensor_count_of_another_split(tmp_path):
    """split.tensors.count (i32) not what the parts hold together."""
    p = parts(tmp_path, "tiny-qwen3", 2)
    set_u_le(p[0], b"split.tensors.count", 4, 23)
    assert "corrupted model: 23 tensors expected but 24 found" in error_line(p[0])


def set_u_le(path: Path, key: bytes, nbytes: int, value: int) -> None:
    """Overwrite a scalar key's value in place (after the key and its u32 type)."""
    data = bytearray(path.read_bytes())
    at = data.index(key) + len(key) + 4
    data[at:at + nbytes] = value.to_bytes(nbytes, "little")
    path.write_bytes(data)


def test_duplicated_tensor_across_parts(tmp_path):
    """Part 2 replaced by a one-part file of every tensor, marked as part 2 of 2."""
    p = parts(tmp_path, "tiny-qwen3", 2)
    q = write_split_gguf("tiny-qwen3", tmp_path / "q", 1, header_only=True)[0]
    set_u_le(q, b"split.no", 2, 1)
    set_u_le(q, b"split.count", 2, 2)
    shutil.copy(q, p[1])
    assert "is duplicated" in error_line(p[0])


@pytest.mark.live
@pytest.mark.parametrize("name,n,flags", [("tiny-qwen3", 3, ["-c", "2048"]),
                                          ("tiny-gemma3", 2, ["-c", "4096", "-np", "2"]),
                                          ("tiny-deepseek3", 3, ["-c", "2048", "-fa", "off"])])
def test_split_equals_real_llama_cpp(tmp_path, name, n, flags):
    pytest.importorskip("llama_cpp")
    from schedplan.backends.llama_cpp_run import run
    first = parts(tmp_path, name, n, header_only=False)[0]
    params = parse_params(flags)
    real, plan = run(str(first), params), reserve(str(first), params)
    for field in SAME + ["model_buffers"]:
        assert plan[field] == real[field], field
    for graph in ("pp", "tg"):
        for key in ("nodes", "splits"):
            assert plan["graphs"][graph][key] == real["graphs"][graph][key]
