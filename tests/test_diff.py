"""planner/diff.py: pairing the planned tensors with the ones a real decode visited."""
from schedplan.planner.diff import first_tensor_mismatch, tensor_summary


def row(name: str, ne: list[int], offset: int) -> dict:
    return {"name": name, "op": "NONE", "ne": ne, "buffer": "Vulkan0", "offset": offset, "size": 4 * ne[0],
            "kind": "leaf", "view_of": None}


def test_copies_of_two_views_of_one_node_pair_by_shape():
    # an SSM_SCAN on the CPU: its y and state views are both copied to Vulkan0 under one name; the
    # decode visits them in the other order than the plan lists them
    name = "Vulkan0#node_34 (view)#0"
    plan = {"tensors": [row(name, [8192, 1, 1, 1], 524304), row(name, [64, 8, 512, 1], 3300112)]}
    real = {"tensors": [row(name, [64, 8, 512, 1], 3300112), row(name, [8192, 1, 1, 1], 524304)]}
    assert first_tensor_mismatch(plan, real) is None
    assert tensor_summary(plan, real)["equal"] == 2
    real["tensors"][1]["offset"] = 0
    assert first_tensor_mismatch(plan, real)["fields"] == ["offset"]


def test_the_inputs_of_an_iswa_cache_pair_in_order():
    # the base and the sliding-window masks share a name; the decode shapes the base one by its n_kv
    # (256), the sliding-window one's reserve shape when the window and a ubatch pad to 256 (tiny-laguna
    # at -ub 32 reported an offset mismatch that was this)
    plan = {"tensors": [row("attn_inp_kq_mask", [4096, 32, 1, 1], 33536), row("attn_inp_kq_mask", [256, 32, 1, 1], 296192)]}
    real = {"tensors": [row("attn_inp_kq_mask", [256, 32, 1, 1], 33536), row("attn_inp_kq_mask", [256, 32, 1, 1], 296192)]}
    assert first_tensor_mismatch(plan, real) is None
    real["tensors"][0]["offset"] = 0
    assert first_tensor_mismatch(plan, real)["fields"] == ["offset"]


def test_a_name_seen_once_pairs_whatever_its_shape():
    # n_kv-sized tensors are smaller in the decode than at reserve time: same name, other shape
    plan = {"tensors": [row("kq-0", [4096, 512, 4, 1], 0)]}
    real = {"tensors": [row("kq-0", [256, 512, 4, 1], 0)]}
    assert tensor_summary(plan, real)["matched"] == 1


def test_copies_of_one_name_and_shape_pair_by_place():
    # graniteswitch's reshaped adapter ids, copied to Vulkan0 once per use under one name: the
    # decode visits them in another order (seed 6098 of the lavapipe fuzz with a control vector)
    name = "Vulkan0#adapter_ids (reshaped)#0"
    plan = {"tensors": [row(name, [1, 31, 1, 1], offset) for offset in (116480, 116608, 116736)]}
    real = {"tensors": [row(name, [1, 31, 1, 1], offset) for offset in (116736, 116480, 116608)]}
    assert first_tensor_mismatch(plan, real) is None
    real["tensors"][1]["offset"] = 116992
    assert first_tensor_mismatch(plan, real)["fields"] == ["offset"]


def test_a_duplicated_weight_pairs_by_buffer():
    # rope_freqs of a llama3-style model: layer 0's on the CPU, a copy for the GPU layers in Vulkan0
    # (TENSOR_DUPLICATED); the decode never lists the CPU one when only offloaded ropes read it
    cpu = row("rope_freqs.weight", [32, 1, 1, 1], 0) | {"buffer": "CPU_Mapped", "usage": "weights"}
    gpu = row("rope_freqs.weight", [32, 1, 1, 1], 920576) | {"usage": "weights"}
    assert first_tensor_mismatch({"tensors": [cpu, gpu]}, {"tensors": [gpu]}) is None
    assert first_tensor_mismatch({"tensors": [cpu, gpu | {"offset": 0}]}, {"tensors": [gpu]})["fields"] == ["offset"]
