"""Split GGUFs as llama-gguf-split writes them and llama.cpp finds them: `name-00001-of-00003.gguf`.

Mirrors llama_split_path and llama_split_prefix (src/llama.cpp) and llama_get_list_splits
(src/llama-model-loader.cpp).
"""
from __future__ import annotations

from typing import Optional

# LLM_KV_SPLIT_NO, LLM_KV_SPLIT_COUNT, LLM_KV_SPLIT_TENSORS_COUNT
LLM_KV_SPLIT_NO, LLM_KV_SPLIT_COUNT, LLM_KV_SPLIT_TENSORS_COUNT = "split.no", "split.count", "split.tensors.count"


def llama_split_path(path_prefix: str, split_no: int, split_count: int) -> str:
    """The path of part split_no (0-based): '%s-%05d-of-%05d.gguf'."""
    return "%s-%05d-of-%05d.gguf" % (path_prefix, split_no + 1, split_count)


def llama_split_prefix(split_path: str, split_no: int, split_count: int) -> Optional[str]:
    """The prefix of a part's path, or None when the path does not end as part split_no should."""
    postfix = "-%05d-of-%05d.gguf" % (split_no + 1, split_count)
    if len(split_path) <= len(postfix) or not split_path.endswith(postfix):
        return None
    return split_path[:-len(postfix)]


def list_splits(path: str, split_no: int, split_count: int) -> list[str]:
    """llama_get_list_splits: every part's path, from the first part's."""
    prefix = llama_split_prefix(path, split_no, split_count)
    if not prefix:
        raise ValueError(f"invalid split file name: {path} (llama.cpp expects NAME-00001-of-{split_count:05d}.gguf)")
    return [llama_split_path(prefix, i, split_count) for i in range(split_count)]
