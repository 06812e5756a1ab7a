"""Special tokens typed as text in a message: one rule for every stage that renders a
conversation with the target's chat template (samples, generate, tokenize, bench).

The rule: a conversation whose message text (content or reasoning, any role, or an assistant
turn's tool calls) holds one of the target's special tokens as text is rejected, naming the
message and the token. It is never
rewritten, and its text is never tokenized some other way.

Why reject: SGLang (and any OpenAI-compatible server that applies the chat template) renders a
conversation to one string and tokenizes it whole, so `<|im_end|>\\n<|im_start|>assistant`
typed in a user message becomes real special ids there: a forged turn. Trained on such a row,
the drafter learns turn structures no honest client sends, and a target asked it answers the
forged structure, not the user. Tokenizing the text as plain text instead would give token
sequences the serving path never produces for the same conversation. Rejected, every kept
conversation tokenizes the same whichever way a server treats typed special tokens, and the
only special ids in a training row are those the template wrote.

Which strings: every token the tokenizer flags special, and every added token the chat template
itself writes around turns (found by rendering a small conversation): some tokenizers leave
their role markers unflagged (DeepSeek-R1's distills, `<｜User｜>`), yet the server reads them
as the turn structure all the same. Other added tokens (Qwen3's `<think>`, tool-call tags)
mark no turn and tokenize the same typed or written: they stay plain text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["TEXT_FIELDS", "special_text_fault", "special_token_strings"]

# The message fields a template renders as text; `tool_calls` is rendered as its JSON.
TEXT_FIELDS = ("content", "reasoning_content", "tool_calls")
# A conversation the template renders with its turn markers (a system turn where it takes one).
_PROBE = (
    {"role": "user", "content": "a"},
    {"role": "assistant", "content": "b"},
    {"role": "user", "content": "c"},
)


def _template_tokens(tokenizer) -> set[str]:
    """The added tokens the chat template writes around turns."""
    added = {t.content for t in tokenizer.added_tokens_decoder.values()}
    found: set[str] = set()
    for probe in ([{"role": "system", "content": "s"}, *_PROBE], list(_PROBE)):
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception:  # a template that refuses a system turn raises its own error
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        found |= {tok for tok in tokenizer.convert_ids_to_tokens(ids) if tok in added}
    return found


# One pattern per tokenizer object: a job loads its target's tokenizer once and never changes it.
@lru_cache(maxsize=8)
def _pattern(tokenizer) -> re.Pattern | None:
    strings = special_token_strings(tokenizer)
    if not strings:
        return None
    return re.compile("|".join(map(re.escape, strings)))


def special_token_strings(tokenizer) -> tuple[str, ...]:
    """The strings the rule refuses in message text (module docstring), longest first."""
    flagged = set(tokenizer.all_special_tokens) | {
        t.content for t in tokenizer.added_tokens_decoder.values() if t.special
    }
    found = {s for s in flagged | _template_tokens(tokenizer) if s}
    return tuple(sorted(found, key=lambda s: (-len(s), s)))


def special_text_fault(tokenizer, messages: Sequence[dict]) -> str | None:
    """Why `messages` break the rule (the first message and token found), or None."""
    pattern = _pattern(tokenizer)
    if pattern is None:
        return None
    for i, message in enumerate(messages):
        for field in TEXT_FIELDS:
            text = message.get(field)
            if field == "tool_calls" and text is not None:
                text = json.dumps(text, ensure_ascii=False)
            hit = pattern.search(text) if isinstance(text, str) else None
            if hit:
                where = "" if field == "content" else f" {field}"
                return (
                    f"{message.get('role')} message {i}{where} holds the special token "
                    f"{hit.group()!r} as text: the target would read it as chat structure, "
                    "not as the words typed (docs/data.md, special tokens)"
                )
    return None
