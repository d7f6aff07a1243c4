"""This machine's devices (`schedplan devices`, and reserve/fit without --device): each source read
from the recorded output of the real tool (fixtures/tools/, see its README), through fake
executables on PATH; the detected devices plan exactly as the same devices declared by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedplan.backends import detect as det
from schedplan.cli import detection
from schedplan.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "fixtures" / "tools"
TINY = REPO / "fixtures" / "gguf" / "tiny-llama.gguf"
MiB = 1024 * 1024
NVIDIA_ARGS = " ".join(det.NVIDIA_QUERY[1:])


class Machine:
    def __init__(self, bin_dir: Path, monkeypatch):
        self.bin, self.monkeypatch = bin_dir, monkeypatch

    def tool(self, name: str, answers: dict[str, tuple[str, int]]) -> None:
        """A fake `name` that prints answers[args] (text, exit status), or refuses other arguments."""
        cases = "".join(f"  '{args}') /bin/cat <<'EOF'\n{text}EOF\n    exit {code};;\n"
                        for args, (text, code) in answers.items())
        script = self.bin / name
        script.write_text(f'#!/bin/sh\ncase "$*" in\n{cases}  *) echo "unexpected arguments: $*" >&2; exit 64;;\nesac\n')
        script.chmod(0o755)

    def nvidia(self, recorded: str, code: int = 0) -> None:
        self.tool("nvidia-smi", {NVIDIA_ARGS: ((TOOLS / recorded).read_text(), code)})


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A Linux machine whose PATH holds only the fake tools a test writes, and llama-cpp-python's
    ggml not asked (its device list is the first source)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(det, "ggml_devices", lambda: None)
    monkeypatch.setattr(det.platform, "system", lambda: "Linux")
    meminfo = det.host_memory
    monkeypatch.setattr(det, "host_memory", lambda: meminfo(TOOLS / "meminfo-linux.txt"))
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    detection.forget()
    yield Machine(bin_dir, monkeypatch)
    detection.forget()


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def detected() -> dict:
    r = run("devices", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_one_nvidia_gpu_plans_as_declared(machine):
    machine.nvidia("nvidia-smi-rtx5070ti.csv")
    (d,) = detected()["devices"]
    spec = f"cuda:{14109 * MiB}:cc=12.0"
    assert (d["name"], d["description"], d["backend"], d["spec"], d["planned"]) == \
        ("CUDA0", "NVIDIA GeForce RTX 5070 Ti", "CUDA", spec, True)
    assert (d["free"], d["total"]) == (14109 * MiB, 16303 * MiB)
    r = run("devices")
    assert r.output.splitlines()[:2] == ["Available devices:",
                                         "  CUDA0: NVIDIA GeForce RTX 5070 Ti (16303 MiB, 14109 MiB free)"]
    declared = ["--device", f"{spec}:total={16303 * MiB}"]
    for command in (["reserve", TINY, "-c", "4096", "--json"], ["fit", TINY, "-fitt", "0", "--json"]):
        auto, by_hand = run(*command), run(*command, *declared)
        assert auto.exit_code == by_hand.exit_code == 0, auto.output
        assert json.loads(auto.output) == json.loads(by_hand.output)
    assert "CUDA0" in json.loads(run("reserve", TINY, "--json").output)["compute_buffers"]


@pytest.mark.parametrize("visible, frees, note", [
    (None, [8404, 12549, 12459, 12549, 67547, 81148, 81032, 65326], ""),
    ("4", [67547], ""),
    ("5,4", [81148, 67547], ""),
    ("3,9,1", [12549], "'9' names no GPU"),
    ("2,2", [12459], "'2' names no GPU (or one named before)"),
    ("", [], ""),
])
def test_cuda_visible_devices(machine, monkeypatch, visible, frees, note):
    """Eight A800s: only the GPUs CUDA_VISIBLE_DEVICES leaves, in its order, up to an entry that
    names none, as the CUDA runtime reads it; they are named CUDA0, CUDA1, ... in that order."""
    machine.nvidia("nvidia-smi-a800x8.csv")
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    found = detected()
    assert [d["free"] // MiB for d in found["devices"]] == frees
    assert [d["name"] for d in found["devices"]] == [f"CUDA{i}" for i in range(len(frees))]
    assert all(d["spec"].endswith(":cc=8.0") for d in found["devices"])
    assert (note in " ".join(found["notes"])) if note else not any("CUDA_VISIBLE" in n for n in found["notes"])
    declared = [x for d in found["devices"] for x in ("--device", f"{d['spec']}:total={d['total']}")] or ["--device", "none"]
    auto, by_hand = run("fit", TINY, "--json"), run("fit", TINY, "--json", *declared)
    assert json.loads(auto.output) == json.loads(by_hand.output)


def test_cuda_visible_devices_by_uuid_is_one_line(machine, monkeypatch):
    machine.nvidia("nvidia-smi-a800x8.csv")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6")
    r = run("reserve", TINY)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "UUID" in r.output and "--device" in r.output


def test_different_gpus_note_the_cuda_order(machine, monkeypatch):
    machine.nvidia("nvidia-smi-rtx4070laptop-rtx5070ti.csv")
    found = detected()
    assert [d["spec"] for d in found["devices"]] == [f"cuda:{7948 * MiB}:cc=8.9", f"cuda:{15799 * MiB}:cc=12.0"]
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in n for n in found["notes"])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    detection.forget()
    assert not any("CUDA_DEVICE_ORDER" in n for n in detected()["notes"])


def test_unified_memory_gpu_is_listed_not_planned(machine):
    """GB10 (DGX Spark): nvidia-smi reports [N/A] memory; an integrated device schedplan does not plan."""
    machine.nvidia("nvidia-smi-gb10.csv")
    (d,) = detected()["devices"]
    assert (d["name"], d["free"], d["integrated"], d["spec"]) == ("CUDA0", None, True, None)
    r = run("reserve", TINY)
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert "CUDA0 (NVIDIA GB10)" in r.output and "integrated" in r.output and "--device none" in r.output


def test_failing_nvidia_smi_is_one_line(machine):
    """nvidia-smi 470 knows no compute_cap field: it fails, and planning says so instead of
    planning for the CPU as if there were no GPU."""
    machine.nvidia("nvidia-smi-no-compute-cap.txt", code=2)
    found = detected()
    assert found["devices"] == [] and len(found["errors"]) == 1
    assert 'Field "compute_cap" is not a valid field to query.' in found["errors"][0]
    r = run("fit", TINY)
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert "exit 2" in r.output and "--device" in r.output


def test_without_tools_the_cpu_is_planned(machine):
    found = detected()
    assert found["devices"] == [] and found["errors"] == [] and found["source"] == "none"
    assert any(n.startswith("nvidia-smi not found") and "--device cuda:" in n for n in found["notes"])
    r = run("devices")
    assert r.output.splitlines()[:2] == ["Available devices:", "  (none)"]
    assert json.loads(run("reserve", TINY, "--json").output) == json.loads(run("reserve", TINY, "--json", "--device",
                                                                               "none").output)


@pytest.mark.parametrize("argv, starts", [
    (["reserve", "m.gguf", "-c", "8192"], True), (["fit", "m.gguf", "-fitt", "512"], True),
    (["reserve", "m.gguf", "--device", "none"], False), (["reserve", "m.gguf", "--device=cuda:8GiB:cc=8.9"], False),
    (["fit", "m.gguf", "--rpc", "127.0.0.1:50052"], False), (["fit", "m.gguf", "--rpc-memory", "h:1=1GiB"], False),
    (["reserve", "--", "llama-server", "-m", "m.gguf"], False), (["reserve", "--help"], False),
    (["devices"], False), (["check", "m.gguf"], False), ([], False)])
def test_detection_starts_before_click_only_where_a_plan_may_use_it(argv, starts):
    """The console script starts detecting before click parses the command line (cli/detection.py):
    not where devices are declared, where no vendor tool's answer would be used."""
    assert detection.may_plan_for_this_machine(argv) == starts


def test_rocm_smi_cards_are_listed_not_planned(machine):
    machine.tool("rocm-smi", {" ".join(det.ROCM_SMI[1:]): ((TOOLS / "rocm-smi-rx6800-raphael.json").read_text(), 0)})
    found = detected()
    assert [(d["name"], d["description"], d["free"], d["total"]) for d in found["devices"]] == [
        ("ROCm0", "Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]", 17163091968 - 692142080, 17163091968),
        ("ROCm1", "Raphael", 67108864 - 26079232, 67108864)]
    r = run("reserve", TINY)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "ROCm0" in r.output and "--device none" in r.output
    assert list(json.loads(run("reserve", TINY, "--json", "--device", "none").output)["compute_buffers"]) == ["CPU"]


def test_rocm_smi_one_card(machine, monkeypatch):
    machine.tool("rocm-smi", {" ".join(det.ROCM_SMI[1:]): ((TOOLS / "rocm-smi-rx7900xt.json").read_text(), 0)})
    (d,) = detected()["devices"]
    assert (d["description"], d["free"], d["total"]) == ("Radeon RX 7900 XT", 21458059264 - 27856896, 21458059264)


@pytest.mark.parametrize("recorded, expected", [
    ("amd-smi-rx7800xt.json", [((16368 - 14569) * MiB, 16368 * MiB)]),
    ("amd-smi-mi300x-list.json", [((196592 - 17153) * MiB, 196592 * MiB), ((196592 - 284) * MiB, 196592 * MiB)]),
])
def test_amd_smi_without_rocm_smi(machine, recorded, expected):
    machine.tool("amd-smi", {" ".join(det.AMD_SMI[1:]): ((TOOLS / recorded).read_text(), 0)})
    found = detected()
    assert [(d["free"], d["total"]) for d in found["devices"]] == expected
    assert all(d["backend"] == "ROCm" and d["spec"] is None for d in found["devices"])


@pytest.mark.parametrize("wired_limit_mb, free", [("114688", 114688 * MiB), ("0", None)])
def test_apple_silicon(machine, monkeypatch, wired_limit_mb, free):
    """Metal's free memory is its working-set limit: iogpu.wired_limit_mb when set, else macOS's
    default, which only Metal reports."""
    monkeypatch.setattr(det.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(det.platform, "machine", lambda: "arm64")
    machine.tool("sysctl", {"-n hw.memsize": ("34359738368\n", 0), "-n iogpu.wired_limit_mb": (f"{wired_limit_mb}\n", 0),
                            "-n machdep.cpu.brand_string": ("Apple M2 Max\n", 0)})
    (d,) = detected()["devices"]
    assert (d["name"], d["description"], d["backend"], d["free"]) == ("MTL0", "Apple M2 Max", "Metal", free)
    r = run("reserve", TINY, "--json")
    if free is None:
        assert r.exit_code == 2 and "iogpu.wired_limit_mb" in r.output and r.output.count("\n") == 1
    else:
        assert d["spec"] == f"metal:{free}" and "MTL0" in json.loads(r.output)["compute_buffers"]


def test_host_memory_from_meminfo():
    total, available = det.host_memory(TOOLS / "meminfo-linux.txt")
    assert available == 18817828 * 1024
    assert total > 0


@pytest.mark.live
def test_ggml_lists_no_cpu_device():
    """llama-cpp-python's own registry (the CPU-only build of these tests): the CPU is not a device,
    as llama-server --list-devices leaves it out."""
    found = det.ggml_devices()
    assert found == []


def test_llama_server_rpc_servers_come_before_the_local_gpus(machine):
    """llama-server --rpc: the servers first, then this machine's GPUs (llama_prepare_model_devices);
    schedplan's own --rpc alone declares the devices (no local ones are added)."""
    machine.nvidia("nvidia-smi-rtx5070ti.csv")
    rpc = ["--rpc", "127.0.0.1:50052", "--rpc-memory", "127.0.0.1:50052=1GiB"]
    r = run("reserve", *rpc, "--json", "--", "llama-server", "-m", TINY, "--rpc", "127.0.0.1:50052", "-fit", "off")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["params"]["devices"] == ["RPC0", "CUDA0"]
    native = json.loads(run("reserve", TINY, *rpc, "--json").output)
    assert native["params"]["devices"] == ["RPC0"]


@pytest.mark.live
@pytest.mark.parametrize("model", ["llama-3.1-8b", "nemotron-3-nano-30b-a3b"])
def test_fit_for_this_machine_equals_llama_fit_params(model):
    """No device flags: schedplan fits for the devices it finds here, llama-fit-params for those
    llama.cpp finds; the same line and status (on a machine whose devices schedplan plans)."""
    import subprocess

    from fixtures.fit_golden import binary
    from fixtures.make_gguf import model_path

    if not binary_exists():
        pytest.skip("no llama-fit-params of llama.cpp 0c1e57098: python fixtures/llama_build.py, or set LLAMA_FIT_PARAMS")
    found = det.detect()
    if found.errors or any(d.spec is None for d in found.model_devices()):
        pytest.skip(f"this machine's devices are not all planned: {found.errors or found.devices}")
    path = str(model_path(model))
    real = subprocess.run([str(binary()), "-m", path], capture_output=True, text=True, timeout=600)
    ours = run("fit", path, "--json")
    assert ours.exit_code == real.returncode, ours.output
    if real.returncode == 0:
        assert json.loads(ours.output)["args"] == real.stdout.strip()


def binary_exists() -> bool:
    import os
    from fixtures.llama_build import bin_dir
    return Path(os.environ.get("LLAMA_FIT_PARAMS") or bin_dir() / "llama-fit-params").exists()


LAVAPIPE = "llvmpipe (LLVM 15.0.6, 256 bits)"


def vulkaninfo(machine) -> None:
    """A fake vulkaninfo: --summary prints lavapipe's recorded summary, --json=0 writes its recorded
    profile into the current directory under the name vulkaninfo gives it."""
    profile = REPO / "fixtures" / "vulkan" / "lavapipe-mesa-22.3.6.json"
    script = machine.bin / "vulkaninfo"
    script.write_text(f"""#!/bin/sh
case "$*" in
  '--summary') /bin/cat '{TOOLS / "vulkaninfo-summary-lavapipe.txt"}';;
  '--json=0') /bin/cat '{profile}' > 'VP_VULKANINFO_llvmpipe_(LLVM_15_0_6,_256_bits)_0_0_1.json';;
  *) echo "unexpected arguments: $*" >&2; exit 64;;
esac
""")
    script.chmod(0o755)


def test_vulkaninfo_lists_vulkan_devices_as_ggml_names_them(machine, monkeypatch):
    """Without ggml's list, vulkaninfo's devices are listed (not planned: their free memory is what
    ggml-vulkan reads), CPU-type ones only where GGML_VK_VISIBLE_DEVICES names them, as ggml-vulkan."""
    vulkaninfo(machine)
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES", raising=False)
    assert detected()["devices"] == []
    detection.forget()
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")
    (d,) = detected()["devices"]
    assert (d["name"], d["description"], d["backend"], d["planned"]) == ("Vulkan0", LAVAPIPE, "Vulkan", False)
    assert "VK_EXT_memory_budget" in d["why_not"]


def test_a_vulkan_device_ggml_lists_is_planned_with_its_profile(machine):
    """ggml's Vulkan device: its profile from vulkaninfo --json (matched by name), kept in the cache,
    and a spec that plans exactly as the same device declared with that profile."""
    vulkaninfo(machine)
    d = det._with_spec(det.LocalDevice("Vulkan0", LAVAPIPE, "Vulkan", 2048 * MiB, 2048 * MiB), det.DEV_GPU, 0, 1 << 30)
    profile = d.spec.split("profile=")[1].split(":total=")[0]
    assert d.spec == f"vulkan:{2048 * MiB}:profile={profile}:total={2048 * MiB}"
    assert Path(profile).read_bytes() == (REPO / "fixtures" / "vulkan" / "lavapipe-mesa-22.3.6.json").read_bytes()
    other = det._with_spec(det.LocalDevice("Vulkan1", "Some GPU", "Vulkan", MiB, MiB), det.DEV_GPU, 0, 1 << 30)
    assert other.spec is None and "vulkaninfo lists no device named 'Some GPU'" in other.why_not


@pytest.mark.live
def test_fit_for_this_machine_with_lavapipe_equals_llama_fit_params(vulkan_device):
    """With lavapipe visible (GGML_VK_VISIBLE_DEVICES=0) and no device flags: schedplan finds it
    through ggml, reads its profile from vulkaninfo, and fits as llama-fit-params does on it."""
    import subprocess

    from fixtures.fit_golden import binary
    from fixtures.make_gguf import model_path

    import os
    import sys

    # in processes of their own: ggml's registry is per process, enumerated once (an earlier test may
    # have loaded it here without the variable)
    env = dict(os.environ, GGML_VK_VISIBLE_DEVICES="0")
    path = str(model_path("qwen3-8b"))
    real = subprocess.run([str(binary()), "-m", path], capture_output=True, text=True, timeout=600, env=env)
    ours = subprocess.run([str(Path(sys.executable).with_name("schedplan")), "fit", path, "--json"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert ours.returncode == real.returncode == 0, ours.stderr
    assert json.loads(ours.stdout)["args"] == real.stdout.strip() == "-c 4096 -ngl 8"
