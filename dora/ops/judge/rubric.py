"""The judge's rubric: a template with {prompt}, {response} and optionally {answer}.

Only those three names are placeholders; any other braces are literal text (a rubric may show
JSON). Filled from a row: {prompt} is the row's `question` (the prompt as written, before the
policy's chat template) when the dataset gave one, else its `prompt`; {response} the model's
final turn (`final_turn_text`) when there is one, else `response_text`; {answer} the `answer`.

With `chat` the filled rubric is the user message of the judge tokenizer's chat template
(generation prompt added), when the tokenizer has one. Everything before the first placeholder
(the template's head and the rubric's instructions) is the same for every row: it is tokenized
once and every row's tokens start with exactly those ids, so the engine's prefix cache
(dora/ops/engines/paged/blocks.py) computes its KV once and shares it across the batch.
"""

from __future__ import annotations

import re
from typing import Any

FIELDS = ("prompt", "response", "answer")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def template_problem(template: Any, what: str = "rubric") -> str | None:
    """Why a template (a judge's rubric, a reward model's input) is unusable (None: fine)."""
    if not isinstance(template, str):
        return f"{what} must be text, got {template!r}"
    names = PLACEHOLDER.findall(template)
    unknown = sorted(set(names) - set(FIELDS))
    if unknown:
        return (f"{what} has placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; the placeholders are "
                "{prompt}, {response} and {answer} (other braces are literal)")
    if "response" not in names:
        return f"{what} has no {{response}}: the model would never see what it scores"
    return None


def row_fields(row: dict[str, Any]) -> dict[str, str]:
    """The placeholders' values for one trajectory row."""
    prompt = row.get("question") if row.get("question") is not None else row.get("prompt")
    response = row["final_turn_text"] if row.get("final_turn_text") is not None else row.get("response_text")
    return {"prompt": str(prompt or ""), "response": str(response or ""),
            "answer": "" if row.get("answer") is None else str(row["answer"])}


def fill(template: str, fields: dict[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: fields[m.group(1)] if m.group(1) in fields else m.group(0), template)


class Rubric:
    """A rubric for one judge tokenizer: text (for a server) or token ids (for an engine) per row."""

    def __init__(self, template: str, tokenizer=None, chat: bool = True):
        self.template = template
        self.tokenizer = tokenizer
        # Fill with markers, wrap in the chat template, and split at the first marker: the head is shared.
        marks = {f: f"\x00{f}\x00" for f in FIELDS}
        wrapped = self._wrap(fill(template, marks), chat)
        cut = min((wrapped.index(m) for m in marks.values() if m in wrapped), default=len(wrapped))
        self.head, self.body = wrapped[:cut], wrapped[cut:]
        self.uses_chat = wrapped != fill(template, marks)
        self.head_ids: list[int] = self._encode(self.head, first=True) if tokenizer is not None else []

    def _wrap(self, content: str, chat: bool) -> str:
        tok = self.tokenizer
        if not chat or tok is None or not getattr(tok, "chat_template", None):
            return content
        return tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)

    def _encode(self, text: str, first: bool) -> list[int]:
        # A chat template writes its own special tokens; a plain rubric gets the tokenizer's BOS, if any, once.
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=first and not self.uses_chat)]

    def text(self, row: dict[str, Any]) -> str:
        """The whole judge prompt for a row."""
        return self.head + self._body(row)

    def ids(self, row: dict[str, Any]) -> list[int]:
        """The judge prompt's tokens for a row: the shared head's ids, then the row's own part."""
        return self.head_ids + self._encode(self._body(row), first=False)

    def _body(self, row: dict[str, Any]) -> str:
        fields = row_fields(row)
        return re.sub("\x00(" + "|".join(FIELDS) + ")\x00", lambda m: fields[m.group(1)], self.body)
