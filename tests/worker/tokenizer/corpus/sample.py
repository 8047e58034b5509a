#!/usr/bin/env python3
"""Corpus sample: Python with f-strings, decorators, type hints and unicode."""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class Token:
    text: str
    id: int = -1

    def __repr__(self) -> str:
        return f"Token({self.text!r}, id={self.id:>6d})"


def words(lines: Iterable[str]) -> list[str]:
    out: list[str] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        out.extend(re.findall(r"\w+|[^\w\s]", line))  # naïve split
        if n % 1000 == 0:
            print(f"{n=} lines, {len(out):,} words")
    return out


if __name__ == "__main__":
    sample = ["Héllo, wörld!", "  indented\tline", "数字 123456789012345678901234567890"]
    for w in words(sample):
        print(Token(w))
    lam = lambda x, *a, **kw: (x ** 2) // 3 if x else None  # noqa: E731
    print({k: v for k, v in zip("abc", range(3))}, lam(7), 1_000_000, 3.14e-10, 0b1010, 0o17)
