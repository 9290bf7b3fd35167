"""A character tokenizer for synthetic tasks and tiny random models.

One token per character of a fixed alphabet (so ids mean the same thing in every process and
run, with no vocabulary file to ship), plus four specials. It speaks the small protocol the
dataset and generate ops use with HF tokenizers too: `encode(text) -> list[int]`,
`decode(ids) -> str`, `eos_token_id`, `pad_token_id`, `bos_token_id`, `vocab_size`.
"""

from __future__ import annotations

import json
import os
import string

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
# printable ASCII without the rarely useful \r \x0b \x0c: digits, letters, punctuation, space, \t, \n
ALPHABET = "".join(c for c in string.printable if c not in "\r\x0b\x0c")


class CharTokenizer:
    """ids 0..3 are <pad> <bos> <eos> <unk>; then one id per character of ALPHABET."""

    kind = "chars"
    chat_template = None  # no chat format: prompts are used as written

    def __init__(self, alphabet: str = ALPHABET):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("CharTokenizer alphabet has repeated characters")
        self.alphabet = alphabet
        self._ids = {c: i + len(SPECIALS) for i, c in enumerate(alphabet)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id, self.unk_token_id = range(4)
        self.pad_token, self.bos_token, self.eos_token, self.unk_token = SPECIALS

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.alphabet)

    def __len__(self) -> int:
        return self.vocab_size

    def token_id(self, ch: str) -> int:
        """The id of one character (raises for characters outside the alphabet)."""
        try:
            return self._ids[ch]
        except KeyError:
            raise ValueError(f"character {ch!r} is not in the CharTokenizer alphabet") from None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # add_special_tokens is accepted for HF compatibility; a BOS is prepended only if asked.
        ids = [self._ids.get(c, self.unk_token_id) for c in text]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out = []
        n = len(SPECIALS)
        for i in ids:
            i = int(i)
            if i >= n:
                out.append(self.alphabet[i - n] if i - n < len(self.alphabet) else "")
            elif not skip_special_tokens:
                out.append(SPECIALS[i])
        return "".join(out)

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.decode([i], skip_special_tokens=False) for i in ids]

    def save_pretrained(self, directory: str) -> None:
        """Write dora_tokenizer.json so a checkpoint folder carries its tokenizer."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "dora_tokenizer.json"), "w") as f:
            json.dump({"kind": self.kind, "specials": list(SPECIALS), "alphabet": self.alphabet}, f)

    @classmethod
    def from_pretrained(cls, directory: str) -> "CharTokenizer":
        with open(os.path.join(directory, "dora_tokenizer.json")) as f:
            meta = json.load(f)
        if meta.get("kind") != cls.kind or tuple(meta.get("specials", ())) != SPECIALS:
            raise ValueError(f"{directory}/dora_tokenizer.json is not a dora chars tokenizer")
        return cls(meta["alphabet"])
