"""One module per llama.cpp architecture, beside src/models/<arch>.cpp: load_arch_hparams,
load_arch_tensors and the graph builder (build), with the arch's rope type (llama_model_rope_type)."""
from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING

from ..arch import LLM_ARCH_NAMES, LLM_ARCH_WITHOUT_MODEL
from ..gguf import shown
from ..hparams import UnsupportedModel

if TYPE_CHECKING:
    from ..model_loader import ModelLoader

# general.architecture -> module of this package (LLM_ARCH_NAMES)
ARCHS = {
    "afmoe": "afmoe",
    "apertus": "apertus",
    "arcee": "arcee",
    "arctic": "arctic",
    "arwkv7": "arwkv7",
    "baichuan": "baichuan",
    "bailingmoe": "bailingmoe",
    "bailingmoe2": "bailingmoe2",
    "bailingmoe3": "bailingmoe3",
    "bert": "bert",
    "bitnet": "bitnet",
    "bloom": "bloom",
    "chameleon": "chameleon",
    "chatglm": "chatglm",
    "codeshell": "codeshell",
    "cogvlm": "cogvlm",
    "cohere2": "cohere2",
    "cohere2moe": "cohere2moe",
    "command-r": "command_r",
    "dbrx": "dbrx",
    "dream": "dream",
    "deci": "deci",
    "deepseek": "deepseek",
    "deepseek2": "deepseek2",
    "deepseek2-ocr": "deepseek2ocr",     # llama_model_deepseek2ocr: own loader, deepseek2's graph (models.h)
    "deepseek32": "deepseek32",
    "deepseek4": "deepseek4",
    "dots1": "dots1",
    "dots3note": "dots3note",
    "ernie4_5": "ernie4_5",
    "ernie4_5-moe": "ernie4_5_moe",
    "eurobert": "eurobert",
    "exaone": "exaone",
    "exaone-moe": "exaone_moe",
    "exaone4": "exaone4",
    "falcon": "falcon",
    "falcon-h1": "falcon_h1",
    "gemma": "gemma",
    "gemma-embedding": "gemma_embedding",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3n": "gemma3n",
    "gemma4": "gemma4",
    "glm-dsa": "glm_dsa",
    "glm4": "glm4",
    "glm4moe": "glm4moe",
    "glm5-next": "glm5_next",
    "gpt-oss": "openai_moe",
    "gpt2": "gpt2",
    "gptneox": "gptneox",
    "granite": "granite",
    "granite_swa": "granite_swa",
    "granitehybrid": "granitehybrid",
    "granitemoe": "granitemoe",
    "graniteswitch": "granite_switch",
    "grok": "grok",
    "grovemoe": "grovemoe",
    "hrm_text": "hrm_text",
    "hunyuan-dense": "hunyuan_dense",
    "hunyuan-moe": "hunyuan_moe",
    "hunyuan_vl": "hunyuan_vl",
    "internlm2": "internlm2",
    "jais": "jais",
    "jais2": "jais2",
    "jamba": "jamba",
    "jina-bert-v2": "jina_bert_v2",
    "jina-bert-v3": "jina_bert_v3",
    "kimi-k3": "kimi_k3",
    "kimi-linear": "kimi_linear",
    "lfm2": "lfm2",
    "llada": "llada",
    "llada-moe": "llada_moe",
    "lfm2moe": "lfm2moe",
    "llama": "llama",
    "llama-embed": "llama_embed",
    "llama4": "llama4",
    "maincoder": "maincoder",
    "mamba": "mamba",
    "mamba2": "mamba2",
    "maple": "maple",
    "mellum": "mellum",
    "mimo2": "mimo2",
    "hy_v3": "hy_v3",
    "hy_v4": "hy_v4",
    "laguna": "laguna",
    "minicpm": "minicpm",
    "minicpm3": "minicpm3",
    "minimax-01": "minimax_01",
    "minimax-m2": "minimax_m2",
    "minimax-m3": "minimax_m3",
    "mistral3": "mistral3",
    "mistral4": "deepseek2",     # llama_model_mistral4 reuses deepseek2's loader and graph (models.h)
    "modern-bert": "modern_bert",
    "mpt": "mpt",
    "muse-glimmer": "muse_glimmer",
    "nanbeige": "nanbeige",
    "nemotron": "nemotron",
    "nemotron_h": "nemotron_h",
    "nemotron_h_moe": "nemotron_h",
    "neo-bert": "neo_bert",
    "nomic-bert": "nomic_bert",
    "nomic-bert-moe": "nomic_bert_moe",
    "olmo": "olmo",
    "olmo2": "olmo2",
    "olmoe": "olmoe",
    "openelm": "openelm",
    "orion": "orion",
    "paddleocr": "paddleocr",    # llama_model_paddleocr: ernie4_5's loader (models.h), its own graph
    "pangu-embedded": "pangu_embed",
    "phi2": "phi2",
    "phi3": "phi3",
    "phimoe": "phimoe",
    "plamo": "plamo",
    "plamo2": "plamo2",
    "plamo3": "plamo3",
    "plm": "plm",
    "pockettts": "pockettts",
    "qwen": "qwen",
    "qwen2": "qwen2",
    "qwen2moe": "qwen2moe",
    "qwen2vl": "qwen2vl",
    "qwen3": "qwen3",
    "qwen35": "qwen35",
    "qwen35moe": "qwen35moe",
    "qwen3moe": "qwen3moe",
    "qwen3next": "qwen3next",
    "qwen3tts": "qwen3vl",       # llama_model_qwen3tts is llama_model_qwen3vl, its lm_head 3072 wide (models.h)
    "qwen3vl": "qwen3vl",
    "qwen3vlmoe": "qwen3vlmoe",
    "qwen4exp": "qwen4exp",
    "refact": "refact",
    "rnd1": "rnd1",
    "rwkv6": "rwkv6",
    "rwkv6qwen2": "rwkv6qwen2",
    "rwkv7": "rwkv7",
    "seed_oss": "seed_oss",
    "smallthinker": "smallthinker",
    "smollm3": "smollm3",
    "spark2_5": "spark2_5",
    "stablelm": "stablelm",
    "starcoder": "starcoder",
    "starcoder2": "starcoder2",
    "step35": "step35",
    "t5": "t5",
    "t5encoder": "t5encoder",
    "talkie": "talkie",
    "wavtokenizer-dec": "wavtokenizer_dec",
    "xverse": "xverse",
}
SUPPORTED_ARCHS = tuple(ARCHS)


def refusal(arch: str) -> str:
    """Why an architecture is not planned: llama.cpp cannot load it as a model, or it can and
    schedplan does not plan it yet."""
    if arch == "clip":
        return "a projector's file (mmproj), which llama.cpp loads only beside a model: pass it with --mmproj"
    if arch not in LLM_ARCH_NAMES or arch == "(unknown)":
        return "llama.cpp does not know it either (llm_arch_from_string: unknown model architecture)"
    if arch in LLM_ARCH_WITHOUT_MODEL:
        return ("llama.cpp knows the name but cannot load it either: llama_model_mapping has no model for it "
                f"(unsupported model architecture: '{arch}')")
    return "llama.cpp loads it; schedplan does not plan it yet"


def arch_module(ml: ModelLoader) -> ModuleType:
    """The module of the file's architecture, or the one-line refusal saying why and naming the
    supported ones."""
    if ml.arch not in ARCHS:
        # the name comes from the file (shortened as ml.fail shortens a reason); the list is ours and
        # longer than ml.fail's 1000 characters since the architectures outgrew it: kept whole
        raise UnsupportedModel(f"{ml.header.path}: architecture '{shown(ml.arch, 200)}' is not supported: "
                               f"{refusal(ml.arch)} (supported: {', '.join(SUPPORTED_ARCHS)})")
    return module(ml.arch)


def module(arch: str) -> ModuleType:
    return import_module(f".{ARCHS[arch]}", __name__)
