"""User turns the target writes itself: where they start, and which of them are kept.

Both the first prompt of a self-written conversation (helper stage `synthesize`) and each
follow-up turn (stage `generate` with `synthesize.turns` > 1) come from the same rendering: the
chat template up to an open user turn (after the conversation so far, if any), continued by the
target; what it writes up to its end-of-turn is the user message. One rendering for both, so a
follow-up is asked exactly the way the first prompt was, on top of the target's own answers.

The failure guarded: a template that does not put a user message's text verbatim into the
prompt would make the target continue some other context; it is refused, not guessed around.
"""

from __future__ import annotations

import hashlib

from specbuild.backends.base import Generation

__all__ = ["open_user_turn", "written_user_turn", "follow_up_seed"]

_SENTINEL = "\u2063specbuild-user-turn\u2063"  # invisible separators: no template emits them


def open_user_turn(tokenizer, messages: list[dict] | tuple = ()) -> str:
    """The chat template rendered over `messages` and then up to where the next user
    message's text starts (with no messages: a first user turn, system prompt included)."""
    text = tokenizer.apply_chat_template(
        [*messages, {"role": "user", "content": _SENTINEL}],
        tokenize=False,
        add_generation_prompt=False,
    )
    if text.count(_SENTINEL) != 1:
        raise ValueError(
            "the target's chat template does not put a user message's text verbatim into the "
            "prompt exactly once; self-written prompts need a template that does"
        )
    return text[: text.index(_SENTINEL)]


def written_user_turn(gen: Generation, max_tokens: int, opener: str = "") -> tuple[str, str | None]:
    """(the user message, None) when the target finished one, else ("", the reason).

    `opener`: the words the turn was started with (`synthesize.openers`), which the target
    continued; the message is both, and an opener with nothing after it is no prompt."""
    if gen.finish_reason == "length":
        return "", f"prompt not finished within {max_tokens} tokens"
    if gen.finish_reason != "stop":
        return "", "backend error: " + str(gen.extra.get("error", gen.finish_reason))
    if not gen.content.strip():
        return "", "empty prompt"
    return (opener + gen.content).strip(), None


def follow_up_seed(seed: int, conversation_id: str, turn: int) -> int:
    """The sampling seed of user turn `turn` (2, 3, ...) of one conversation: a function of the
    seed, the conversation's id and the turn only (sha256, never Python's salted hash()), so a
    conversation is written the same whichever shard or batch it lands in."""
    digest = hashlib.sha256(f"{conversation_id}\0{turn}".encode()).digest()
    return seed + int.from_bytes(digest[:4], "big") % 2**30
