"""Live randomized differential tests: llama shapes and flags the fixtures do not cover (head sizes
64/80/96/128, GQA ratios, odd vocabularies, K-quant mixes, tied or not; ubatches, streams, KV types,
RPC topologies), and every other architecture's tiny model with its own knobs changed (layers,
sliding windows, head sizes, expert counts and groups), each planned from its header and run in
real llama.cpp. Seeds are fixed, so a failure names a reproducible case:
`pytest tests/test_live_random.py -k seed7`.
"""
from __future__ import annotations

import copy
import random

import pytest

pytest.importorskip("llama_cpp", reason="live tests need llama-cpp-python (the `run` extra)")

from fixtures.make_gguf import LORA_TARGETS, load_config, write_cvec_gguf, write_gguf, write_lora_gguf  # noqa: E402
from schedplan.backends.llama_cpp_run import RunError, run  # noqa: E402
from schedplan.cli.errors import USER_ERRORS  # noqa: E402
from schedplan.cli.options import parse_params  # noqa: E402
from schedplan.planner.diff import diff, first_tensor_mismatch  # noqa: E402
from schedplan.planner.ggml import GGMLAbort  # noqa: E402
from schedplan.planner.reserve import reserve  # noqa: E402

pytestmark = pytest.mark.live


def random_config(rng: random.Random, name: str) -> dict:
    cfg = copy.deepcopy(load_config("tiny-llama-untied"))
    head, n_head = rng.choice([64, 80, 96, 128]), rng.choice([2, 4, 6, 8])
    md = cfg["metadata"]
    md.update({"general.name": name, "llama.embedding_length": head * n_head, "llama.attention.head_count": n_head,
               "llama.attention.head_count_kv": rng.choice([d for d in (1, 2, n_head) if n_head % d == 0]),
               "llama.rope.dimension_count": head, "llama.block_count": rng.choice([1, 2, 3]),
               "llama.feed_forward_length": rng.choice([256, 512, 768, 1024]),
               "llama.context_length": rng.choice([2048, 4096, 8192])})
    n_vocab = rng.choice([1000, 1024, 3001, 4096])
    md["llama.vocab_size"] = cfg["vocab"]["n_vocab"] = n_vocab
    k_quants = (head * n_head) % 256 == 0          # K-quant rows are multiples of 256
    wt = rng.choice(["F16", "Q8_0", "Q4_0", "IQ4_NL"] + (["Q4_K", "Q5_K", "Q6_K"] if k_quants else []))
    cfg["tensor_types"] = {"*_norm.weight": "F32", "token_embd.weight": rng.choice(["F16", "Q8_0", wt]),
                           "output.weight": rng.choice(["Q8_0", wt] + (["Q6_K"] if k_quants else [])),
                           "*ffn_down*": rng.choice([wt, "Q6_K", "Q8_0"]), "*": wt}
    cfg["tied_embeddings"] = rng.random() < 0.4
    cfg["name"] = name
    return cfg


def random_flags(rng: random.Random, n_layer: int, endpoints: list[str]) -> list[str]:
    flags = ["-c", str(rng.choice([256, 512, 1000, 2048, 3000]))]
    if rng.random() < 0.5:
        flags += ["-ub", str(rng.choice([1, 16, 31, 32, 64, 256, 700]))]
    if rng.random() < 0.3:
        flags += ["-b", str(rng.choice([64, 256, 1024]))]
    if rng.random() < 0.4:
        flags += ["-np", str(rng.choice([2, 3, 4]))]
    if rng.random() < 0.3:
        flags += ["-kvu"]
    fa = rng.choice(["on", "off", "auto"])
    flags += ["-fa", fa]
    if rng.random() < 0.4:
        flags += ["-ctk", rng.choice(["q8_0", "q4_0", "f16", "bf16"])]
        if fa != "off" and rng.random() < 0.5:
            flags += ["-ctv", rng.choice(["q8_0", "q4_0", "f16"])]
    if rng.random() < 0.2:
        flags += ["--no-repack"]
    if endpoints:
        flags += ["-ngl", str(rng.choice([0, 1, n_layer, n_layer + 1, 99]))]
        if len(endpoints) == 2 and rng.random() < 0.5:
            flags += ["-ts", rng.choice(["3,1", "1,2", "1,1"])]
        if rng.random() < 0.2:
            flags += ["-nkvo"]
        flags += [x for e in endpoints for x in ("--rpc", e)]
    return flags


# tiny models whose header knobs random_arch_config varies; the hybrid ones keep their layer
# layout (per-layer arrays and patterns fix it)
ARCH_MODELS = ["tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe", "tiny-qwen2moe", "tiny-gemma2", "tiny-gemma3", "tiny-phi3",
               "tiny-smollm3", "tiny-mistral3", "tiny-mixtral", "tiny-gpt-oss", "tiny-deepseek3", "tiny-qwen35",
               "tiny-qwen35moe", "tiny-qwen3next", "tiny-lfm2", "tiny-mamba2", "tiny-granitehybrid", "tiny-nemotron-h",
               "tiny-glm4moe", "tiny-llama4", "tiny-granitemoe", "tiny-ernie4_5-moe",
               "tiny-bailingmoe2", "tiny-dots1", "tiny-hunyuan-moe", "tiny-qwen3vl", "tiny-qwen3vlmoe",
               "tiny-deepseek32", "tiny-kimi-linear", "tiny-gemma4", "tiny-gemma4-e2b", "tiny-deepseek", "tiny-dbrx",
               "tiny-grok", "tiny-arctic", "tiny-smallthinker", "tiny-minimax-m2", "tiny-glm-dsa", "tiny-deepseek4",
               "tiny-kimi-k3", "tiny-glm5-next", "tiny-mamba", "tiny-jamba", "tiny-falcon-h1", "tiny-rwkv6",
               "tiny-rwkv6qwen2", "tiny-rwkv7", "tiny-arwkv7", "tiny-plamo", "tiny-plamo2", "tiny-plamo3", "tiny-plamo3-full", "tiny-plm", "tiny-minimax-01", "tiny-lfm2-swa",
               "tiny-bailingmoe3", "tiny-dots3note", "tiny-cohere2moe", "tiny-exaone-moe", "tiny-grovemoe",
               "tiny-afmoe", "tiny-apertus", "tiny-seed_oss", "tiny-maincoder", "tiny-nanbeige", "tiny-mellum",
               "tiny-talkie", "tiny-spark2_5", "tiny-muse-glimmer", "tiny-maple", "tiny-hrm_text", "tiny-jais2",
               "tiny-gemma", "tiny-glm4", "tiny-command-r", "tiny-cohere2", "tiny-olmo2", "tiny-olmo", "tiny-granite",
               "tiny-granite-vision", "tiny-granite-swa", "tiny-graniteswitch", "tiny-exaone4", "tiny-exaone",
               "tiny-internlm2", "tiny-minicpm", "tiny-minicpm3", "tiny-phi2", "tiny-phimoe", "tiny-starcoder2",
               "tiny-starcoder", "tiny-qwen", "tiny-qwen2vl", "tiny-ernie4_5", "tiny-hunyuan-dense", "tiny-hunyuan_vl", "tiny-qwen4exp",
               "tiny-minimax-m3", "tiny-step35", "tiny-mimo2",
               "tiny-stablelm", "tiny-baichuan", "tiny-xverse", "tiny-orion", "tiny-refact", "tiny-arcee",
               "tiny-gpt2", "tiny-gptneox", "tiny-bloom", "tiny-mpt", "tiny-falcon", "tiny-falcon-40b",
               "tiny-chatglm", "tiny-deepseek2-ocr", "tiny-paddleocr", "tiny-chameleon", "tiny-cogvlm", "tiny-gemma3n",
               "tiny-codeshell", "tiny-nemotron", "tiny-jais", "tiny-openelm", "tiny-bitnet", "tiny-bailingmoe", "tiny-deci",
               "tiny-hy_v3", "tiny-hy_v4", "tiny-hy_v4-full", "tiny-laguna", "tiny-laguna-full",
               "tiny-bert", "tiny-bert-rerank", "tiny-nomic-bert", "tiny-nomic-bert-moe", "tiny-jina-bert-v2",
               "tiny-jina-bert-v3", "tiny-modern-bert", "tiny-neo-bert", "tiny-eurobert", "tiny-gemma-embedding",
               "tiny-t5", "tiny-t5encoder", "tiny-qwen3tts", "tiny-pockettts", "tiny-wavtokenizer-dec",
               "tiny-pangu-embedded", "tiny-llama-embed", "tiny-dream", "tiny-llada", "tiny-llada-moe", "tiny-rnd1", "tiny-eagle3"]
FIXED_LAYOUT = {"qwen35", "qwen35moe", "qwen3next", "lfm2", "mamba2", "granitehybrid", "nemotron_h", "kimi-linear",
                "jamba", "plamo2", "minimax-01", "bailingmoe3", "dots3note", "apertus", "spark2_5",
                "maple", "qwen4exp", "gemma3n", "openelm", "deci", "wavtokenizer-dec", "eagle3"}


def random_arch_config(rng: random.Random, name: str) -> dict:
    cfg = copy.deepcopy(load_config(rng.choice(ARCH_MODELS)))
    md = cfg["metadata"]
    arch = md["general.architecture"]
    p = arch + "."
    if arch not in FIXED_LAYOUT:
        # glm4's, glm4moe's, exaone4's, bailingmoe2's, deepseek32's, step35's, mimo2's and hy_v3's last block is their
        # multi-token-prediction block: at least one more runs; cohere2moe's trunk keeps a sliding-window layer
        # (its pattern's layer 0 is full, and a sliding-window cache without layers aborts llama.cpp's first
        # decode: an unallocated mask input)
        md[p + "block_count"] = rng.choice([2, 3, 5, 7] if arch in ("glm4", "glm4moe", "exaone4", "bailingmoe2",
                                                                    "deepseek32", "glm-dsa", "exaone-moe", "step35",
                                                                    "mimo2", "hy_v3")
                                           else [3, 5, 7] if arch == "cohere2moe" else [1, 2, 3, 5, 7])
    if p + "attention.sliding_window" in md:
        md[p + "attention.sliding_window"] = rng.choice([32, 64, 128, 512, 1000])
    if arch in ("gemma3", "gemma"):
        md[p + "attention.key_length"] = md[p + "attention.value_length"] = rng.choice([64, 128, 256])
    if arch == "gemma4":   # the per-layer arrays follow the block count; all-dense patterns make llama.cpp abort
        n = md[p + "block_count"]
        swa = [rng.random() < 0.7 for _ in range(n)]
        n_head_kv = [rng.choice([1, 2]) for _ in range(n)]
        if isinstance(md[p + "feed_forward_length"], list):
            md[p + "feed_forward_length"] = [rng.choice([256, 512, 1024]) for _ in range(n)]
        if p + "attention.shared_kv_layers" in md:
            n_kept = n - rng.randrange(n)
            md[p + "attention.shared_kv_layers"] = n - n_kept
            # llama.cpp aborts unless the last two kept layers are a sliding and a full one whose K/V
            # fit the layers that reuse them: mostly so, sometimes not
            if n_kept >= 2 and rng.random() < 0.8:
                swa[n_kept - 2], swa[n_kept - 1] = True, False
                for il in range(n_kept, n):
                    n_head_kv[il] = n_head_kv[n_kept - 2 if swa[il] else n_kept - 1]
        md[p + "attention.sliding_window_pattern"] = swa
        md[p + "attention.head_count_kv"] = n_head_kv
    if arch in ("qwen3moe", "qwen2moe", "gpt-oss", "glm4moe", "llama4", "granitemoe", "ernie4_5-moe",
                "dots1", "hunyuan-moe", "qwen3vlmoe", "kimi-linear", "deepseek", "dbrx", "grok", "arctic",
                "smallthinker", "minimax-m2", "deepseek4", "kimi-k3", "glm5-next", "jamba",
                "minimax-01", "bailingmoe3", "dots3note", "cohere2moe", "exaone-moe", "grovemoe", "afmoe", "mellum",
                "maple", "granite_swa", "qwen4exp", "minimax-m3", "step35", "mimo2", "deepseek2-ocr",
                "bailingmoe", "hy_v3", "hy_v4", "laguna", "nomic-bert-moe", "llada-moe", "rnd1") \
            or arch == "gemma4" and p + "expert_count" in md:
        md[p + "expert_count"] = rng.choice([4, 8, 16])
        md[p + "expert_used_count"] = rng.choice([1, 2, 4])
    if arch in ("glm4moe", "bailingmoe2", "dots1", "kimi-linear", "deepseek", "bailingmoe3", "dots3note",
                "cohere2moe", "exaone-moe", "afmoe", "minimax-m3", "deepseek2-ocr", "laguna"):
        md[p + "leading_dense_block_count"] = rng.choice([0, 1])
    if arch == "bailingmoe3":   # expert groups that divide the drawn expert count and stay below it
        md[p + "expert_group_count"], md[p + "expert_group_used_count"] = \
            rng.choice([(2, 1), (4, 2)] if md[p + "expert_count"] > 4 else [(2, 1)])
    if arch == "ernie4_5-moe":
        md[p + "leading_dense_block_count"] = rng.choice([0, 1])
        md[p + "interleave_moe_layer_step"] = rng.choice([1, 2])
    if arch == "llama4":
        md[p + "interleave_moe_layer_step"] = rng.choice([0, 1, 2, 3])
    if arch == "nanbeige":   # the loops (logical layers: block_count times num_loops) and the norm between them
        md[p + "num_loops"] = rng.choice([1, 2, 3])
        md[p + "skip_loop_final_norm"] = rng.random() < 0.5
    if arch == "hrm_text":   # the stacks and their cycles; block_count is the cache slots they make
        lps, h_cycles, l_cycles = rng.choice([1, 2]), rng.choice([1, 2]), rng.choice([1, 2, 3])
        md[p + "hrm.layers_per_stack"], md[p + "hrm.h_cycles"], md[p + "hrm.l_cycles"] = lps, h_cycles, l_cycles
        md[p + "block_count"] = lps * h_cycles * (l_cycles + 1)
    if arch in ("qwen3vl", "qwen3vlmoe"):   # as many deepstack layers as blocks, or more, too
        md[p + "n_deepstack_layers"] = rng.choice([0, 1, 2, 3, 5])
    if arch in ("deepseek2", "deepseek32", "glm-dsa"):
        md[p + "leading_dense_block_count"] = rng.choice([0, 1])
        md[p + "expert_group_count"], md[p + "expert_group_used_count"] = rng.choice([(4, 2), (2, 1)])
    if arch in ("deepseek32", "glm-dsa"):   # the indexer: its heads, key length (a power of two) and top-k around n_kv
        md[p + "attention.indexer.head_count"] = rng.choice([1, 4, 8])
        md[p + "attention.indexer.key_length"] = rng.choice([64, 128])
        md[p + "attention.indexer.top_k"] = rng.choice([16, 768, 8192])
    if arch == "glm-dsa":   # full and shared indexer layers: every one full, or the first full and the others shared
        n_layer = md[p + "block_count"] - 1
        if rng.random() < 0.5:
            md[p + "attention.indexer.types"] = [True] * n_layer
            cfg["optional_tensors"].append("blk.*.indexer.*")
        else:
            md[p + "attention.indexer.types"] = [True] + [False] * (n_layer - 1)
            cfg["optional_tensors"].append("blk.0.indexer.*")
        cfg["optional_tensors"] = [g for g in cfg["optional_tensors"] if g != "blk.2.indexer.*"]
    if arch == "deepseek4":   # per layer: compression ratios (mostly one at 4: else llama.cpp crashes), clamps
        n = md[p + "block_count"]
        ratios = [rng.choice([0, 4, 128]) for _ in range(n + rng.choice([0, 1]))]
        if rng.random() < 0.9:
            ratios[rng.randrange(n)] = 4
        md[p + "attention.compress_ratios"] = ratios
        md[p + "swiglu_clamp_exp"] = md[p + "swiglu_clamp_shexp"] = [rng.choice([0.0, 10.0])] * n
        md[p + "hash_layer_count"] = rng.choice([0, 1, 2, n])
        md[p + "attention.output_group_count"] = rng.choice([1, 2, 4, 8])
        md[p + "hyper_connection.sinkhorn_iterations"] = rng.choice([1, 3, 20])
        md[p + "attention.indexer.head_count"] = rng.choice([1, 4, 8])
        md[p + "attention.indexer.key_length"] = rng.choice([64, 128])
        md[p + "attention.indexer.top_k"] = rng.choice([16, 512, 8192])
    if arch == "kimi-k3":   # KDA/MLA layer mix, residual banking, gate bound, latent experts, situ
        # at least one layer of each kind: with none, llama.cpp's hybrid input asserts at the first decode
        n = md[p + "block_count"] = max(2, md[p + "block_count"])
        kv = [rng.choice([0, 1]) for _ in range(n)]
        kv[rng.randrange(n)], kv[rng.randrange(n)] = 0, 1
        md[p + "attention.head_count_kv"] = kv if 0 in kv else [0] + kv[1:]
        md[p + "leading_dense_block_count"] = rng.choice([0, 1])
        md[p + "attn_res.block_size"] = rng.choice([0, 1, 2, 3, 5])
        md[p + "expert_shared_count"] = rng.choice([1, 2])
        md[p + "activation.situ_linear_beta"] = rng.choice([0.0, 25.0])
        if rng.random() < 0.3:
            del md[p + "kda.gate_lower_bound"]
        if rng.random() < 0.3:
            del md[p + "expert_latent_length"]
    if arch == "glm5-next":   # KDA/DSA layer mix, NextN block or not, full/shared indexers, pools, clamps
        n = rng.choice([2, 3, 5, 7])
        kv = [rng.choice([0, 1]) for _ in range(n)]
        kv[rng.randrange(n)], kv[rng.randrange(n)] = 0, 1
        kv = kv if 0 in kv else [0] + kv[1:]
        nextn = rng.random() < 0.5
        md[p + "block_count"] = n + nextn
        if nextn:
            kv.append(1)
        else:
            del md[p + "nextn_predict_layers"]
        md[p + "attention.head_count_kv"] = kv
        full = [rng.random() < 0.6 for _ in range(n)]
        full[kv.index(1)] = True    # the first DSA layer runs its own indexer (else llama.cpp aborts)
        md[p + "attention.indexer.types"] = full
        cfg["optional_tensors"] += [f"blk.{il}.indexer*" for il in range(n) if kv[il] and not full[il]
                                    and rng.random() < 0.2]
        kpool = rng.choice([2, 4, 8])
        md[p + "attention.indexer.kpool"] = kpool
        md[p + "attention.indexer.top_k"] = kpool * rng.choice([1, 4, 64, 2048])
        md[p + "attention.indexer.kpool_select_tail"] = rng.random() < 0.7
        md[p + "attention.indexer.head_count"] = rng.choice([1, 4, 8])
        md[p + "attention.indexer.key_length"] = rng.choice([32, 64, 128])
        md[p + "hyper_connection.sinkhorn_iterations"] = rng.choice([1, 3, 20])
        md[p + "leading_dense_block_count"] = rng.choice([0, 1])
        for key in ("swiglu_clamp_exp", "swiglu_clamp_shexp"):
            md[p + key] = [rng.choice([0.0, 10.0])] * (n + nextn)
            if rng.random() < 0.2:
                del md[p + key]
        if rng.random() < 0.3:
            del md[p + "kda.gate_lower_bound"]
    if arch == "qwen4exp":   # hyper-connection streams; QSA's indexer heads, top-k around n_kv, block sizes
        md[p + "hyper_connection.count"] = rng.choice([2, 4, 8])
        md[p + "attention.indexer.head_count"] = rng.choice([1, 2, 4])
        md[p + "attention.indexer.top_k"] = rng.choice([16, 768, 8192])
        md[p + "attention.compress_ratios"] = [0 if recr else rng.choice([0, 1, 4, 16])
                                               for recr in md[p + "attention.recurrent_layers"]]
    if arch == "minimax-m3":   # MSA's blocks, top blocks around their count, local ones (other block sizes than
        # powers of two make llama.cpp's decode gather rows out of range: GGML_PAD is a bit mask)
        md[p + "attention.indexer.block_size"] = rng.choice([16, 64, 128])
        md[p + "attention.indexer.top_k"] = rng.choice([1, 2, 16])
        md[p + "attention.indexer.local_blocks"] = rng.choice([0, 1, 2])
        md[p + "expert_shared_count"] = rng.choice([1, 2])
        # and a sparse layer: with every layer dense, llama.cpp's decode sets the indexer cache's input
        # that no node reads (GGML_ASSERT(buffer)); its reserve, which schedplan plans, is fine
        md[p + "leading_dense_block_count"] = min(md[p + "leading_dense_block_count"], md[p + "block_count"] - 1)
    if arch == "step35":   # per layer: window or not, head counts, SwiGLU limits; dense or experts (the file says)
        n = md[p + "block_count"]
        for key, values in [("attention.sliding_window_pattern", [True, False]), ("attention.head_count", [2, 4, 6]),
                            ("attention.head_count_kv", [1, 2]), ("swiglu_clamp_exp", [0.0, 7.0]),
                            ("swiglu_clamp_shexp", [0.0, 16.0])]:
            md[p + key] = [rng.choice(values) for _ in range(n)]
        n_dense = rng.choice([0, 1])
        ffn = [("ffn_gate", "ffn_up", "ffn_down") if il < n_dense or il == n - 1 else
               ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp",
                "ffn_down_shexp") for il in range(n)]
        cfg["optional_tensors"] = ([f"blk.*.{t}.weight" for t in ("attn_q_norm", "attn_k_norm", "attn_gate")
                                    if rng.random() < 0.8] +
                                   [f"blk.{il}.{t}.weight" for il in range(n) for t in ffn[il]] +
                                   [f"blk.{il}.exp_probs_b.bias" for il in range(n_dense, n - 1)] +
                                   [f"blk.{n - 1}.nextn.shared_head_{t}.weight" for t in ("head", "norm")])
    if arch == "mimo2":   # per layer: window or not, KV heads, fused QKV or not, sinks; head sizes; value scale
        n = md[p + "block_count"]
        md[p + "attention.sliding_window_pattern"] = [rng.choice([0, 1]) for _ in range(n)]
        md[p + "attention.head_count_kv"] = [rng.choice([1, 2, 4]) for _ in range(n)]
        md[p + "attention.key_length"], md[p + "attention.value_length"] = rng.choice([(96, 64), (64, 64), (64, 128)])
        md[p + "attention.value_scale"] = rng.choice([0.707, 1.0])
        n_dense = rng.choice([0, 1])
        cfg["optional_tensors"] = (
            [f"blk.{il}.attn_qkv.weight" for il in range(n) if rng.random() < 0.5] +
            [f"blk.{il}.attn_sinks.weight" for il in range(n) if rng.random() < 0.5] +
            [f"blk.{il}.{t}" for il in range(n) for t in (
                ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight") if il < n_dense or il == n - 1 else
                ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
                 "exp_probs_b.bias"))])
    if arch == "hy_v3":   # per layer (the MTP block too): dense or experts, gate and up experts merged or not
        n = md[p + "block_count"]
        md[p + "attention.head_count_kv"] = rng.choice([1, 2, 4])
        n_dense = rng.choice([0, 1])
        cfg["optional_tensors"] = [f"blk.{n - 1}.nextn.shared_head_norm.weight"]
        for il in range(n):
            if il < n_dense:
                ffn = ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
            else:
                ffn = ["ffn_gate_inp.weight", "exp_probs_b", "ffn_down_exps.weight", "ffn_gate_shexp.weight",
                       "ffn_up_shexp.weight", "ffn_down_shexp.weight"]
                ffn += ["ffn_gate_up_exps.weight"] if rng.random() < 0.3 else ["ffn_gate_exps.weight",
                                                                                "ffn_up_exps.weight"]
            cfg["optional_tensors"] += [f"blk.{il}.{t}" for t in ffn]
    if arch == "hy_v4":   # per layer: the experts' SwiGLU limit, the indexer (layer 0's always) or the top-k reused
        n = md[p + "block_count"]
        md[p + "swiglu_clamp_exp"] = [rng.choice([0.0, 10.0]) for _ in range(n)]
        md[p + "leading_dense_block_count"] = rng.choice([0, 1])
        md[p + "hyper_connection.count"] = rng.choice([2, 4])
        if p + "attention.indexer.types" in md:
            md[p + "attention.indexer.types"] = [True] + [rng.random() < 0.5 for _ in range(n - 1)]
            md[p + "attention.indexer.top_k"] = rng.choice([16, 256, 8192])
    if arch == "laguna":   # per layer: query heads over the uniform KV heads, the gate per head or per element
        n = md[p + "block_count"]
        heads = [rng.choice([2, 4, 6]) for _ in range(n)]
        md[p + "attention.head_count"] = heads
        per_element = rng.random() < 0.5
        cfg["tensor_shapes"] = {f"blk.{il}.attn_gate.weight": [md[p + "embedding_length"],
                                                                heads[il] * (md[p + "attention.key_length"] if per_element else 1)]
                                for il in range(n)}
    if arch in ("t5", "t5encoder"):   # head size, Flan's gated GELU or T5's ReLU; t5: at most as many decoder blocks
        md[p + "attention.key_length"] = md[p + "attention.value_length"] = rng.choice([32, 64, 128])
        gate = "*.ffn_gate.weight"
        cfg["optional_tensors"] = [g for g in cfg["optional_tensors"] if g != gate] + ([gate] * (rng.random() < 0.5))
        if arch == "t5":
            md[p + "decoder_block_count"] = rng.randint(1, md[p + "block_count"])
    md["general.name"] = cfg["name"] = name
    return cfg


def random_adapters(rng: random.Random, cfg: dict, tmp_path) -> list[str]:
    """A LoRA over every matrix of the blocks (rank and scale drawn), a control vector (its layer
    range drawn), or both; a model without block matrices gets the vector alone."""
    flags = []
    kind = rng.choice(["lora", "cvec", "both"])
    if kind != "cvec":
        try:
            lora = write_lora_gguf(cfg, tmp_path / "lora.gguf", rng.choice([1, 4, 16]), LORA_TARGETS["blocks"], 16.0)
            flags += ["--lora-scaled", f"{lora}:{rng.choice(['1', '0.5', '2'])}"]
        except ValueError:       # no weight of the blocks to adapt
            kind = "cvec"
    if kind != "lora":
        flags += ["--control-vector-scaled", f"{write_cvec_gguf(cfg, tmp_path / 'cvec.gguf')}:0.8"]
        if rng.random() < 0.3:
            flags += ["--control-vector-layer-range", str(rng.randint(1, 3)), str(rng.randint(1, 4))]
    return flags


def _check(seed: int, tmp_path, endpoints: list[str], make_config=random_config, adapters: bool = False) -> None:
    rng = random.Random(seed)
    cfg = make_config(rng, f"random-{seed}")
    path = str(write_gguf(cfg, tmp_path / f"random-{seed}.gguf"))
    arch = cfg["metadata"]["general.architecture"]
    flags = random_flags(rng, cfg["metadata"][f"{arch}.block_count"], endpoints)
    if adapters:
        flags += random_adapters(rng, cfg, tmp_path)
    params = parse_params(flags)
    try:
        real = run(path, params, tensors=True)
    except RunError as e:
        if "re-planned the compute buffers" in str(e):
            # the decode that reads the tensors would not reuse the reserve's offsets: compare the
            # reservation itself, as the goldens do
            real = run(path, params)
            assert [r for r in diff(reserve(path, params), real) if not r.ok] == [], flags
            return
        if "GGML_ASSERT(i01 >= 0 && i01 < ne01)" in str(e):
            # learned positions past n_ctx_train: the decode of the reserve's ubatch reads past the
            # position table, which llama.cpp warned of when it created the context; so does the plan
            assert any("possible training context overflow" in w for w in reserve(path, params)["warnings"]), flags
            return
        with pytest.raises(USER_ERRORS):     # llama.cpp refused: so must the plan
            reserve(path, params)
        return
    try:
        plan = reserve(path, params, tensors=True)
    except GGMLAbort as e:
        if "warm-up" in str(e):
            # the tensor run decodes the reserve's ubatch, not llama-server's warm-up: run that
            with pytest.raises(RunError, match="encoder requires n_ubatch >= n_tokens"):
                run(path, params)
            return
        # the plan's "abort at the first decode" can only be seen where the real run decoded
        assert "first decode" in str(e) and real.get("tensors_unmeasurable"), (flags, str(e))
        return
    unequal = [r for r in diff(plan, real) if not r.ok]
    assert unequal == [], (flags, unequal)
    assert first_tensor_mismatch(plan, real) is None, (flags, first_tensor_mismatch(plan, real))
    assert real.get("tensors") or real.get("tensors_unmeasurable"), flags


@pytest.mark.parametrize("seed", [*range(24), 1164], ids=lambda s: f"seed{s}")   # 1164: llama.cpp aborts
def test_random_llama_on_cpu(seed, tmp_path):
    _check(seed, tmp_path, [])


@pytest.mark.parametrize("seed", range(100, 112), ids=lambda s: f"seed{s}")
def test_random_llama_on_rpc_servers(seed, tmp_path, rpc_endpoints):
    _check(seed, tmp_path, rpc_endpoints[: 1 + seed % 2])


@pytest.mark.parametrize("seed", range(200, 216), ids=lambda s: f"seed{s}")
def test_random_architectures_on_cpu(seed, tmp_path):
    _check(seed, tmp_path, [], random_arch_config)


@pytest.mark.parametrize("seed", range(300, 308), ids=lambda s: f"seed{s}")
def test_random_architectures_on_rpc_servers(seed, tmp_path, rpc_endpoints):
    _check(seed, tmp_path, rpc_endpoints[: 1 + seed % 2], random_arch_config)


@pytest.mark.parametrize("seed", range(400, 412), ids=lambda s: f"seed{s}")
def test_random_architectures_with_adapters_on_cpu(seed, tmp_path):
    _check(seed, tmp_path, [], random_arch_config, adapters=True)


@pytest.mark.parametrize("seed", range(500, 506), ids=lambda s: f"seed{s}")
def test_random_architectures_with_adapters_on_rpc_servers(seed, tmp_path, rpc_endpoints):
    _check(seed, tmp_path, rpc_endpoints[: 1 + seed % 2], random_arch_config, adapters=True)
