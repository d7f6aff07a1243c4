"""Planner: GGUF header -> hparams -> graphs -> scheduler -> allocator, mirroring llama.cpp."""

LLAMA_CPP_COMMIT = "0c1e57098"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
