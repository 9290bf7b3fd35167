"""Who runs in a step, and which KV blocks each request holds (bookkeeping only: no tensors).

A request moves  waiting -> prefilling -> running -> finished (or parked, when keep_kv).
- Admission (`admit`) takes waiting requests in order while decode slots (max_batch) and blocks
  last. A request gets, at once, every block its tokens need; full blocks of its context that are
  cached (a shared prompt, its own earlier turn) are shared instead of computed, and the partial
  last block's tokens, when another request computed the same context, are copied (blocks.py
  tails). A request whose next block or tail is being computed by another one right now waits a
  step for it (the G samples of a group thus prefill their prompt once).
- Prefill (`prefill_chunks`) computes at most `max_prefill_tokens` context tokens per step, oldest
  request first, so a long prompt is cut into chunks and never stalls the decode of the others.
- Decode (`reserve_decode`) gives every running request the block its next token's KV goes to;
  when the pool is short it drops parked requests (oldest first), then sends the newest running
  request back to the queue (it is prefilled again later).
"""

from __future__ import annotations

import collections
from typing import Callable

from ..engine import EngineStats
from .blocks import BlockPool, chain_hash, version_seed
from .sequence import Seq

PLACED, WAIT_BLOCKS, WAIT_PREFIX = "placed", "wait_blocks", "wait_prefix"


class Scheduler:
    def __init__(self, pool: BlockPool, *, max_batch: int, max_prefill_tokens: int,
                 version_of: Callable[[int], int], grow: Callable[[int], bool],
                 write_kv: Callable[[Seq], None], copy_kv: Callable[[int, int, int], None]):
        self.pool = pool
        self.bs = pool.block_size
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.version_of = version_of   # slot -> the version its weights hold (seeds the prefix hashes)
        self.grow = grow               # ask the KV tensor for more blocks; False at the budget
        self.write_kv = write_kv       # write an admitted request's imported KV into its blocks
        self.copy_kv = copy_kv         # copy the first n slots' KV of block src into block dst
        self.waiting: collections.OrderedDict[str, Seq] = collections.OrderedDict()
        self.prefilling: list[Seq] = []
        self.running: list[Seq] = []
        self.parked: collections.OrderedDict[str, Seq] = collections.OrderedDict()
        self.prefill_tokens = self.prefix_hit_tokens = self.reprefill_tokens = 0
        self.parked_dropped = self.preempted = self.continuation_reprefill_tokens = 0

    @property
    def active(self) -> int:
        return len(self.prefilling) + len(self.running)

    def in_flight(self) -> list[Seq]:
        return self.running + self.prefilling + list(self.waiting.values())

    def find(self, uid: str) -> Seq | None:
        if uid in self.waiting:
            return self.waiting[uid]
        return next((s for s in self.running + self.prefilling if s.uid == uid), None)

    # ------------------------------------------------------------ admission
    def admit(self) -> None:
        for seq in list(self.waiting.values()):
            if self.active >= self.max_batch:
                return
            outcome = self._place(seq)
            if outcome == WAIT_BLOCKS:
                return          # in order: a later request does not overtake one waiting for blocks
            if outcome == WAIT_PREFIX:
                continue
            del self.waiting[seq.uid]
            (self.running if seq.computed == seq.context else self.prefilling).append(seq)

    def _place(self, seq: Seq) -> str:
        if seq.adopt is not None:
            return self._adopt(seq)
        if seq.pending_kv is not None:
            need = seq.blocks_needed(self.bs)
            if not self.make_room(need):
                return WAIT_BLOCKS
            seq.blocks = self.pool.take(need)
            self.write_kv(seq)   # sets computed, drops pending_kv
            self.seal(seq)
            return PLACED
        n_full, bs = seq.context // self.bs, self.bs
        toks = [tuple(seq.tokens[i * bs:(i + 1) * bs]) for i in range(n_full)]
        hashes, h = [], version_seed(self.version_of(seq.slot))
        for t in toks:
            h = chain_hash(h, t)
            hashes.append(h)
        hit, pending = self.pool.match(hashes, toks)
        tail = tuple(seq.tokens[n_full * bs:seq.context])
        tail_hash = chain_hash(h, tail)
        src, tail_pending = self.pool.match_tail(tail_hash, tail) if tail and len(hit) == n_full else (None, False)
        if pending or tail_pending:
            return WAIT_PREFIX
        shared = hit + ([src] if src is not None else [])
        need = seq.blocks_needed(bs) - len(hit)
        if not self.make_room(need + self.pool.free_among(shared)):
            return WAIT_BLOCKS
        for b in shared:              # (src only until copied: no take below may hand it out)
            self.pool.share(b)
        seq.blocks = hit + self.pool.take(need)
        for i in range(len(hit), n_full):   # findable at once: a twin waits for them instead of computing them
            self.pool.register(seq.blocks[i], hashes[i], toks[i], ready=False)
        seq.hashes, seq.sealed, seq.computed = hashes, len(hit), len(hit) * bs
        if src is not None:
            self.copy_kv(src, seq.blocks[n_full], len(tail))
            self.pool.release([src])
            seq.computed += len(tail)
        elif tail:
            self.pool.register_tail(seq.blocks[n_full], tail_hash, tail)
        self.prefix_hit_tokens += seq.computed
        return PLACED

    def _adopt(self, seq: Seq) -> str:
        parked = seq.adopt
        extra = seq.blocks_needed(self.bs) - len(parked.blocks)
        if not self.make_room(extra):
            return WAIT_BLOCKS
        seq.blocks = parked.blocks + self.pool.take(extra)
        seq.hashes, seq.sealed, seq.computed = parked.hashes, parked.sealed, parked.computed
        self.prefix_hit_tokens += parked.computed
        seq.adopt = None
        return PLACED

    def make_room(self, n: int) -> bool:
        """At least n free blocks: grow the pool up to its budget, then drop parked requests."""
        while self.pool.free_count < n:
            if self.grow(n - self.pool.free_count):
                continue
            if not self.parked:
                return False
            self.drop_oldest_parked()
        return True

    # ------------------------------------------------------------ prefill
    def prefill_chunks(self) -> list[tuple[Seq, int, int]]:
        budget, chunks = self.max_prefill_tokens, []
        for seq in self.prefilling:
            if budget <= 0:
                break
            n = min(seq.context - seq.computed, budget)
            chunks.append((seq, seq.computed, seq.computed + n))
            budget -= n
        return chunks

    def prefilled(self, chunks: list[tuple[Seq, int, int]]) -> None:
        for seq, start, end in chunks:
            seq.computed = end
            self.prefill_tokens += end - start
            if seq.reprefill:
                self.reprefill_tokens += end - start
            if seq.lost_parked:
                self.continuation_reprefill_tokens += end - start
            self.seal(seq)
            if end == seq.context:
                if end % self.bs:
                    self.pool.tail_ready(seq.blocks[end // self.bs])
                seq.reprefill = seq.lost_parked = False
                self.prefilling.remove(seq)
                self.running.append(seq)

    def seal(self, seq: Seq) -> None:
        """Make seq's newly computed full blocks findable in the prefix cache."""
        done = seq.computed // self.bs
        for i in range(seq.sealed, done):
            toks = tuple(seq.tokens[i * self.bs:(i + 1) * self.bs])
            if i == len(seq.hashes):
                prev = seq.hashes[-1] if seq.hashes else version_seed(self.version_of(seq.slot))
                seq.hashes.append(chain_hash(prev, toks))
            self.pool.register(seq.blocks[i], seq.hashes[i], toks, ready=True)
        seq.sealed = max(seq.sealed, done)

    # ------------------------------------------------------------ decode
    def reserve_decode(self) -> None:
        bs, i = self.bs, 0
        while i < len(self.running):
            seq = self.running[i]
            if len(seq.blocks) * bs >= len(seq.tokens):     # the block of position `context` exists
                i += 1
            elif self.make_room(1):
                seq.blocks += self.pool.take(1)
                i += 1
            else:
                self.preempt(self.running[-1])

    def preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        self._drop_blocks(seq)
        self.waiting[seq.uid] = seq
        self.waiting.move_to_end(seq.uid, last=False)
        self.preempted += 1

    # ------------------------------------------------------------ leaving
    def finish(self, seqs: list[Seq]) -> None:
        if not seqs:
            return
        gone = set(map(id, seqs))
        self.running = [s for s in self.running if id(s) not in gone]
        for seq in seqs:
            if seq.req.keep_kv:
                old = self.parked.pop(seq.uid, None)   # (a uid parked before: its KV is superseded)
                if old is not None:
                    self.pool.release(old.blocks)
                seq.kv_version = self.version_of(seq.slot)
                self.parked[seq.uid] = seq
            else:
                self._drop_blocks(seq)

    def remove(self, seq: Seq) -> None:
        """Take an in-flight request out (abort, export), releasing what it holds."""
        if self.waiting.pop(seq.uid, None) is None:
            (self.running if seq in self.running else self.prefilling).remove(seq)
        if seq.adopt is not None:
            self.pool.release(seq.adopt.blocks)
            seq.adopt = None
        self._drop_blocks(seq)

    def _drop_blocks(self, seq: Seq) -> None:
        self.pool.release(seq.blocks)
        seq.blocks, seq.hashes, seq.sealed, seq.computed = [], [], 0, 0

    def drop_oldest_parked(self) -> None:
        _, seq = self.parked.popitem(last=False)
        self.pool.release(seq.blocks)
        self.parked_dropped += 1

    def release(self, uid: str) -> bool:
        seq = self.parked.pop(uid, None)
        if seq is not None:
            self.pool.release(seq.blocks)
        return seq is not None

    def release_parked_on(self, slot: int) -> None:
        """Release the parked KV computed by `slot`'s weights (that version left the engine)."""
        for uid in [u for u, s in self.parked.items() if s.slot == slot]:
            self.pool.release(self.parked.pop(uid).blocks)

    def parked_blocks(self) -> int:
        return sum(len(s.blocks) for s in self.parked.values())

    def stats(self, *, budget: int, version: int, generated_tokens: int) -> EngineStats:
        """The engine's stats: these counters, a KV budget of `budget` blocks."""
        pool, held = self.pool, self.running + self.prefilling + list(self.parked.values())
        return EngineStats(
            active=self.active, queued=len(self.waiting), kv_tokens_used=sum(q.computed for q in held),
            kv_tokens_capacity=budget * self.bs, version=version, reprefill_tokens=self.reprefill_tokens,
            generated_tokens=generated_tokens, prefill_tokens=self.prefill_tokens, prefix_hit_tokens=self.prefix_hit_tokens,
            kv_blocks_used=pool.used_count, kv_blocks_free=budget - pool.used_count, parked_requests=len(self.parked),
            parked_blocks=self.parked_blocks(), parked_dropped=self.parked_dropped, preempted=self.preempted,
            continuation_reprefill_tokens=self.continuation_reprefill_tokens)
