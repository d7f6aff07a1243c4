"""tools/mtmd/mtmd.cpp mtmd_get_memory_usage: what llama-server adds to each device's --fit target
before fitting the model (server-context.cpp): per device, the projector's weights (ggml_nbytes of
each tensor it loads) and its warm-up graph's compute buffers, vision and audio encoders summed.

It loads the projector without the text model (no embedding-size check: that happens when
llama-server loads the projector for real, after fitting; see check_n_embd), with the server's
mtmd parameters: --no-mmproj-offload (use_gpu), -mmdev (device), -fa, --image-min-tokens,
--image-max-tokens, --no-warmup.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...backends.types import Backend
from ..ggml import GGMLAbort
from ..hparams import UnsupportedModel
from ..params import MmprojParams, Params
from .clip import ClipContextParams, ClipCtx, clip_init, clip_n_mmproj_embd, registry_devices


@dataclass
class MmprojPlan:
    """A projector planned as llama-server loads it for mtmd_get_memory_usage."""
    path: str
    devices: list[Backend]          # ggml's device registry, in order (the --fit target of device i is target i)
    contexts: list[tuple[str, ClipCtx]]   # ("vision" / "audio", its clip_ctx)
    # the audio-generation context (qwen3tts_gen): its weights are allocated on its device, but
    # mtmd_get_memory_usage merges only ctx_v and ctx_a, so they are not in memory_usage()
    ctx_gen_a: Optional[ClipCtx] = None

    def memory_usage(self) -> dict[str, int]:
        """mtmd_get_memory_usage: bytes per device name (clip_get_mem_usage of each context, summed)."""
        total: dict[str, int] = {}
        for _, ctx in self.contexts:
            for part in (ctx.mem_usage, ctx.mem_compute):
                for dev, size in part.items():
                    total[dev] = total.get(dev, 0) + size
        return total

    def allocated(self) -> dict[str, int]:
        """What loading the projector for real allocates per device name: memory_usage() and the
        gen-audio context's weights, which mtmd_get_memory_usage leaves out."""
        total = self.memory_usage()
        if self.ctx_gen_a is not None:
            for dev, size in self.ctx_gen_a.mem_usage.items():
                total[dev] = total.get(dev, 0) + size
        return total

    def n_embd(self) -> int:
        """clip_n_mmproj_embd of the vision encoder, else the audio one."""
        return clip_n_mmproj_embd(self.contexts[0][1].model)

    def summary(self) -> dict:
        """JSON-able: per encoder its type, device, weights and compute per buffer type, graph."""
        encoders = []
        for modality, ctx in self.contexts:
            encoders.append({"modality": modality, "projector_type": ctx.model.proj_type,
                             "device": ctx.backend.device_name, "flash_attn": ctx.flash_attn_type == 1,
                             "warmup_size": _warmup(ctx), "n_embd": clip_n_mmproj_embd(ctx.model),
                             "weights": {ctx.weights.buft.name: sum(ctx.mem_usage.values())},
                             "compute_buffers": dict(ctx.compute_buffers), "nodes": ctx.n_nodes,
                             "splits": ctx.n_splits})
        out = {"path": self.path, "encoders": encoders, "memory_usage": self.memory_usage()}
        if self.ctx_gen_a is not None:
            g = self.ctx_gen_a
            out["gen_audio"] = {"projector_type": g.model.proj_type, "device": g.backend.device_name,
                                "n_embd": clip_n_mmproj_embd(g.model),
                                "weights": {g.weights.buft.name: sum(g.mem_usage.values())},
                                "counted_in_memory_usage": False}
        return out


def _warmup(ctx: ClipCtx) -> list[int]:
    """The warm-up input: an image's width and height, or audio's frames and mel bins."""
    from .clip import warmup_size
    return list(warmup_size(ctx))


def mtmd_context_params(params: Params, mmproj: "MmprojParams") -> ClipContextParams:
    """The server's mtmd_context_params (server-context.cpp load_model), as clip_context_params."""
    fa = {"auto": -1, "off": 0, "on": 1}[params.flash_attn]
    return ClipContextParams(use_gpu=mmproj.use_gpu, device=mmproj.device, flash_attn_type=fa,
                             image_min_tokens=mmproj.image_min_tokens, image_max_tokens=mmproj.image_max_tokens,
                             warmup=mmproj.warmup)


def mtmd_get_memory_usage(params: Params, mmproj: MmprojParams) -> MmprojPlan:
    devices = registry_devices(params)
    res = clip_init(mmproj.path, devices, mtmd_context_params(params, mmproj), params.header_cache)
    contexts = [(m, c) for m, c in (("vision", res.ctx_v), ("audio", res.ctx_a)) if c is not None]
    if not contexts:
        raise UnsupportedModel(f"{mmproj.path}: llama.cpp would fail to load the multimodal projector: it has "
                               f"neither a vision nor an audio encoder (clip.has_vision_encoder, clip.has_audio_encoder)")
    if res.ctx_v is not None and res.ctx_a is not None:
        n_embd_v, n_embd_a = clip_n_mmproj_embd(res.ctx_v.model), clip_n_mmproj_embd(res.ctx_a.model)
        if n_embd_v != n_embd_a:
            raise UnsupportedModel(f"{mmproj.path}: llama.cpp would fail to load the multimodal projector: mismatch "
                                   f"between vision and audio mmproj (n_embd_v = {n_embd_v}, n_embd_a = {n_embd_a})")
    if res.ctx_v is not None:
        init_vision(mmproj.path, res.ctx_v)
    if res.ctx_a is not None:
        init_audio(res.ctx_a)
    return MmprojPlan(mmproj.path, devices, contexts, res.ctx_gen_a)


def init_vision(path: str, ctx_v: ClipCtx) -> None:
    """mtmd_context::init_vision's checks (its image preprocessor and slice template per type): a
    MiniCPM-V resampler of a version it has no template for is refused."""
    version = ctx_v.model.hparams.minicpmv_version
    if ctx_v.model.proj_type == "resampler" and version not in (0, 2, 3, 4, 5, 6, 100045):
        raise UnsupportedModel(f"{path}: llama.cpp would fail to load the multimodal projector: unsupported "
                               f"minicpmv version: {version}")


def init_audio(ctx: ClipCtx) -> None:
    """mtmd_context::init_audio: the audio preprocessor's initialize(); Parakeet's takes its mel
    filterbank and window from the file (mtmd-audio.cpp GGML_ASSERTs on their sizes: n_mel_bins x
    (n_fft / 2 + 1) filters, a window of window_len <= n_fft; n_fft 512, window 400)."""
    hp = ctx.model.hparams
    if ctx.model.proj_type == "parakeet":
        n_fft, window_len = 512, 400
        if hp.n_mel_filters != hp.n_mel_bins * (n_fft // 2 + 1) or hp.n_window != window_len:
            raise GGMLAbort(f"llama.cpp would abort initializing the audio preprocessor (mtmd-audio.cpp GGML_ASSERTs "
                            f"on the file's a.mel_filters and a.window): {hp.n_mel_filters} filter values for "
                            f"{hp.n_mel_bins} mel bins x {n_fft // 2 + 1}, a window of {hp.n_window} for {window_len}")


def check_n_embd(plan: MmprojPlan, model_path: str, n_embd_inp: int) -> None:
    """mtmd_context's check when llama-server loads the projector with the text model: the
    projector's output must be the model's input embedding size."""
    n_embd_clip = plan.n_embd()
    if n_embd_inp != n_embd_clip:
        raise UnsupportedModel(f"{plan.path}: llama.cpp would fail to load the multimodal projector for {model_path}: "
                               f"mismatch between text model (n_embd = {n_embd_inp}) and mmproj (n_embd = "
                               f"{n_embd_clip}); a projector of another model?")
    if plan.ctx_gen_a is not None:
        n_embd_gen = clip_n_mmproj_embd(plan.ctx_gen_a.model)
        if n_embd_inp != n_embd_gen:
            raise UnsupportedModel(f"{plan.path}: llama.cpp would fail to load the multimodal projector for {model_path}: "
                                   f"mismatch between text model (n_embd = {n_embd_inp}) and gen-audio mmproj (n_embd = "
                                   f"{n_embd_gen}); a projector of another model?")
