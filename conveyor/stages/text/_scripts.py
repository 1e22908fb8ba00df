"""Scripts written without spaces between words, shared by the filters and dedup.

In Chinese, Japanese, Thai and the like a run between spaces is a clause, not a word: the
filters and the dedup shingles take each character of these scripts as a word.
"""

from __future__ import annotations

import re

#: Thai, Lao, Myanmar, Khmer, kana, Han
UNSPACED = (
    "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\U00020000-\U0002fa1f"
)
#: one character of such a script
UNSPACED_CHAR = re.compile(f"[{UNSPACED}]")
#: the words of a text: each such character alone, other runs between spaces whole
UNSPACED_WORDS = re.compile(f"[{UNSPACED}]|[^\\s{UNSPACED}]+")
