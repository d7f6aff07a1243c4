"""Planner: GGUF header -> hparams -> graphs -> scheduler -> allocator, mirroring llama.cpp."""

LLAMA_CPP_COMMIT = "0c1e57098"
