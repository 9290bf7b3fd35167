"""The KV block pool's bookkeeping (no tensors): which blocks are free, who holds each, and the
prefix cache.

A block holds `block_size` consecutive tokens' KV of one sequence. Block 0 is never handed out:
it is where padded rows of a captured decode batch write (the "slot -1" of other engines), so
they never touch a real request's KV. A block may be held by several sequences (ref count) when
it is a full block of a shared prefix: the G samples of a group hold their prompt's blocks once.

Prefix cache: a full block is known by a hash chained over every token before it and seeded
with the weights version that computed it (KV of other weights is not the same KV). A block is
`ready` once its KV is computed; a sequence that would share a block still being computed waits
for it rather than computing it again. Freed blocks keep their hash and go to the back of the
free list, so the least recently freed is reused first and a prefix freed a moment ago is still
found.

Tails: a context's last, partial block cannot be shared (its holder writes its next tokens there),
but its KV can be copied. The block holding a request's tail is findable by the tail's chained
hash (`register_tail`, ready once prefilled); a twin with the same full blocks and tail copies
those slots into a block of its own instead of computing them: a GRPO group of short prompts
(shorter than a block) computes its prompt once too.

Sized for millions of blocks: building or growing the pool is a few array allocations, never a
loop over its blocks. Ref counts and ready flags are numpy arrays; blocks never held yet are a
range (`fresh`: handed out first, they hold no cached prefix); only blocks that were held and
freed are in the ordered free list, and only blocks in the prefix cache have a hash entry.
"""

from __future__ import annotations

import collections

import numpy as np

TRASH_BLOCK = 0


def chain_hash(prev: int, tokens: tuple[int, ...]) -> int:
    return hash((prev, tokens))


def version_seed(version: int) -> int:
    return hash(("dora-kv", int(version)))


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"KV block pool: {num_blocks} blocks; at least 2 are needed (block 0 is reserved)")
        self.block_size = block_size
        self.num_blocks = 0
        self.refs = np.zeros(0, dtype=np.int32)
        self.ready = np.zeros(0, dtype=bool)
        self.hash_of: dict[int, int] = {}                # block -> its chained hash (blocks in the prefix cache)
        self.tokens_of: dict[int, tuple[int, ...]] = {}  # the block's tokens, to rule out hash collisions
        self.by_hash: dict[int, int] = {}
        self.tails: dict[int, int] = {}                  # tail hash -> the block whose first slots hold that tail
        self.tail_of: dict[int, tuple[int, tuple[int, ...]]] = {}   # block -> (its tail hash, the tail's tokens)
        self.fresh = TRASH_BLOCK + 1                     # blocks fresh.. were never held: free, caching nothing
        self.freed: collections.OrderedDict[int, None] = collections.OrderedDict()   # held once, free now; oldest first
        self.grow(num_blocks)
        self.refs[TRASH_BLOCK] = 1

    # ------------------------------------------------------------ size
    def grow(self, num_blocks: int) -> None:
        """Add blocks up to num_blocks in all (the KV tensor grew to match): they join the fresh range."""
        if num_blocks <= self.num_blocks:
            return
        more = num_blocks - self.num_blocks
        self.refs = np.concatenate([self.refs, np.zeros(more, dtype=np.int32)])
        self.ready = np.concatenate([self.ready, np.zeros(more, dtype=bool)])
        self.num_blocks = num_blocks         # the fresh range fresh..num_blocks extends over the new blocks

    @property
    def free_count(self) -> int:
        return self.num_blocks - self.fresh + len(self.freed)

    @property
    def used_count(self) -> int:
        return self.num_blocks - 1 - self.free_count

    # ------------------------------------------------------------ holding blocks
    def take(self, n: int) -> list[int]:
        """n free blocks: never-held ones first, then the least recently freed (their cached prefix
        is forgotten)."""
        if n > self.free_count:
            raise RuntimeError(f"KV block pool: {n} blocks wanted, {self.free_count} free")
        k = min(n, self.num_blocks - self.fresh)
        out = list(range(self.fresh, self.fresh + k))
        self.refs[self.fresh:self.fresh + k] = 1
        self.fresh += k
        for _ in range(n - k):
            b, _ = self.freed.popitem(last=False)
            self._forget(b)
            self.refs[b] = 1
            out.append(b)
        return out

    def share(self, b: int) -> None:
        if self.refs[b] == 0:
            del self.freed[b]
        self.refs[b] += 1

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):   # the tail first: a prefix's head stays cached longest
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if not self.ready[b]:
                    self._forget(b)   # never computed: nobody may find it
                self.freed[b] = None

    # ------------------------------------------------------------ prefix cache
    def match(self, hashes: list[int], blocks_tokens: list[tuple[int, ...]]) -> tuple[list[int], bool]:
        """The cached blocks of the longest ready prefix, and whether the next block is being
        computed by another sequence right now (then the caller waits for it)."""
        found = []
        for h, toks in zip(hashes, blocks_tokens):
            b = self.by_hash.get(h)
            if b is None or self.tokens_of.get(b) != toks:
                return found, False
            if not self.ready[b]:
                return found, True
            found.append(b)
        return found, False

    def match_tail(self, h: int, tokens: tuple[int, ...]) -> tuple[int | None, bool]:
        """The block holding this tail's KV in its first slots (None: none known), and whether it
        is being computed right now (then the caller waits for it)."""
        b = self.tails.get(h)
        if b is None or self.tail_of[b][1] != tokens:
            return None, False
        return (b, False) if self.ready[b] else (None, True)

    def register_tail(self, b: int, h: int, tokens: tuple[int, ...]) -> None:
        """Block b will hold the tail with chained hash h in its first slots (ready: tail_ready)."""
        self._forget(b)
        self.tail_of[b] = (h, tokens)
        self.tails.setdefault(h, b)

    def tail_ready(self, b: int) -> None:
        if b in self.tail_of:
            self.ready[b] = True

    def free_among(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self.refs[b] == 0)

    def register(self, b: int, h: int, tokens: tuple[int, ...], ready: bool) -> None:
        """Make block b findable as the full block with chained hash h (first holder wins)."""
        if self.hash_of.get(b) == h:
            self.ready[b] = self.ready[b] or ready
            return
        self._forget(b)
        self.hash_of[b], self.tokens_of[b], self.ready[b] = h, tokens, ready
        self.by_hash.setdefault(h, b)

    def _forget(self, b: int) -> None:
        h = self.hash_of.pop(b, None)
        if h is not None and self.by_hash.get(h) == b:
            del self.by_hash[h]
        self.tokens_of.pop(b, None)
        tail = self.tail_of.pop(b, None)
        if tail is not None and self.tails.get(tail[0]) == b:
            del self.tails[tail[0]]
        self.ready[b] = False

    def forget_all(self) -> None:
        """Drop the prefix cache (the KV tensor was released or will be overwritten)."""
        self.hash_of.clear()
        self.tokens_of.clear()
        self.by_hash.clear()
        self.tails.clear()
        self.tail_of.clear()
        self.ready[:] = False
