"""Runs the model: prefill chunks and decode steps of one weight slot over the shared KV cache.

A weight slot is one PagedLM (one policy version's weights) with its decode graphs. Every slot
shares the KV tensor, the rotary tables and the graph memory pool; with max_versions > 1 the
engine keeps several slots and runs each on its own requests (the KV of a request is computed
by its slot's weights only).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from . import hf_weights as W
from .cuda_graphs import DecodeGraphs, capture_cuda
from .decoder import PagedLM, rope_tables
from .blocks import BlockPool
from .kv_cache import KVCache
from .model_spec import ModelSpec
from .sequence import Seq
from .step_inputs import META_COLS, decode_meta, decode_width, fill_decode_rows, prefill_inputs

MAX_SPLITS = 16   # context partitions of the decode kernel at small batch sizes


@dataclasses.dataclass(eq=False)
class WeightSlot:
    model: PagedLM
    version: int | None = None        # None: holds no version (free, or woken without weights)
    graphs: DecodeGraphs | None = None


def triton_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("triton") is not None


class ModelRunner:
    def __init__(self, spec: ModelSpec, hf_config, *, dtype: torch.dtype, device: torch.device, max_batch: int,
                 max_seq_len: int, block_size: int, cuda_graphs: bool, attention: str | None = None):
        self.spec, self.dtype, self.device = spec, dtype, torch.device(device)
        self.max_batch, self.block_size, self.max_seq_len = max_batch, block_size, max_seq_len
        self.width = -(-max_seq_len // block_size)          # block-table columns of a maximum-length request
        self.rope = rope_tables(hf_config, max_seq_len, self.device)
        self.cuda = self.device.type == "cuda"
        if attention not in (None, "triton", "torch"):
            raise ValueError(f"torch engine: attention must be 'triton' or 'torch' (None: triton on CUDA), got {attention!r}")
        self.triton = attention == "triton" or (attention is None and self.cuda and triton_available())
        self.use_graphs = self.cuda and cuda_graphs
        self.capture = capture_cuda                  # (tests: cuda_graphs.run_eagerly, see use_graph_capture)
        self.graph_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.graph_captures = 0                      # decode graphs captured so far (stats: graph_captures)
        self.kv: KVCache | None = None
        self.shapes: dict[str, torch.Size] = {}
        self.slots: list[WeightSlot] = []

    def new_slot(self) -> WeightSlot:
        model = PagedLM(self.spec, self.dtype, self.device).eval()
        self.shapes = W.shapes_of(model)
        self.slots.append(WeightSlot(model))
        return self.slots[-1]

    # ------------------------------------------------------------ forward passes
    @torch.inference_mode()
    def prefill(self, slot: WeightSlot, chunks: list[tuple[Seq, int, int]]) -> None:
        ids, positions, meta = prefill_inputs(chunks, self.block_size, self.spec.group, self.device, self.triton)
        slot.model(ids, positions, self.rope, self.kv.layers, meta)

    @torch.inference_mode()
    def decode(self, slot: WeightSlot, seqs: list[Seq]) -> torch.Tensor:
        """Logits [len(seqs), vocab] of each sequence's next token (its last token's KV written)."""
        if self.use_graphs and len(seqs) <= self.max_batch:
            if slot.graphs is None:
                slot.graphs = self._capture(slot)
            fill_decode_rows(seqs, self.block_size, slot.graphs.host)
            return slot.graphs.replay(len(seqs))
        return self._decode_eager(slot, seqs)

    def _decode_eager(self, slot: WeightSlot, seqs: list[Seq]) -> torch.Tensor:
        rows = np.zeros((len(seqs), META_COLS + decode_width(seqs)), dtype=np.int32)
        fill_decode_rows(seqs, self.block_size, rows)
        return self._decode_step(slot.model, torch.from_numpy(rows).to(self.device), self._splits(len(seqs)))

    def _decode_step(self, model: PagedLM, rows: torch.Tensor, splits: int) -> torch.Tensor:
        ids, positions, meta = decode_meta(rows, self.block_size, self.spec.group, splits=splits, triton=self.triton)
        return model.logits(model(ids, positions, self.rope, self.kv.layers, meta))

    def _capture(self, slot: WeightSlot) -> DecodeGraphs:
        graphs = DecodeGraphs(lambda rows, splits: self._decode_step(slot.model, rows, splits), max_batch=self.max_batch,
                              width=self.width, vocab=self.spec.vocab, dtype=self.dtype, device=self.device,
                              pool=self.graph_pool, splits_for=self._splits, capture=self.capture)
        self.graph_captures += len(graphs.graphs)
        return graphs

    def use_graph_capture(self, capture) -> None:
        """Decode through graphs made by `capture` (cuda_graphs.py) on any device: the tests drive the
        graph path on CPU with cuda_graphs.run_eagerly."""
        self.use_graphs, self.capture = True, capture

    def has_graphs(self) -> bool:
        return any(slot.graphs is not None for slot in self.slots)

    def _splits(self, rows: int) -> int:
        """Context partitions per row for the Triton kernel: enough programs to fill the GPU twice over."""
        if not (self.triton and self.cuda):
            return 1
        target = 2 * torch.cuda.get_device_properties(self.device).multi_processor_count
        splits = 1
        while rows * self.spec.kv_heads * splits < target and splits < MAX_SPLITS:
            splits *= 2
        return splits

    def drop_graphs(self) -> None:
        for slot in self.slots:
            slot.graphs = None
        if self.use_graphs and self.cuda:
            torch.cuda.synchronize(self.device)
            self.graph_pool = torch.cuda.graph_pool_handle()   # the next captures start a fresh pool

    # ------------------------------------------------------------ memory
    @torch.inference_mode()
    def warm_up(self, pool: BlockPool) -> None:
        """Capture every hosted slot's decode graphs and compile the attention kernel's prefill
        variants now (Triton specializes on the block table's row stride: 1, a multiple of 16, other),
        on blocks of `pool` taken and given back (they hold nothing anyone finds)."""
        for slot in self.slots:
            if self.use_graphs and slot.version is not None and slot.graphs is None:
                slot.graphs = self._capture(slot)
        if not self.triton:
            return
        for blocks in (1, 2, 16):
            tokens = min(blocks * self.block_size, self.max_seq_len)
            seq = Seq(req=None, stops=frozenset(), tokens=[0] * tokens)   # type: ignore[arg-type]
            seq.blocks = pool.take(seq.blocks_needed(self.block_size))
            try:
                self.prefill(self.slots[0], [(seq, 0, tokens - 1)])
            finally:
                pool.release(seq.blocks)
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def largest_chunk(self, max_prefill_tokens: int) -> list[tuple[Seq, int, int]]:
        """The largest prefill the scheduler sends: max_prefill_tokens context tokens (no more than
        max_batch requests hold), packed from requests of the longest context, on blocks 1, 2, ..."""
        longest = self.max_seq_len - 1
        total = min(max_prefill_tokens, self.max_batch * longest)
        chunks, first = [], 1
        while total > 0:
            n = min(total, longest)
            seq = Seq(req=None, stops=frozenset(), tokens=[0] * (n + 1))   # type: ignore[arg-type]
            blocks = seq.blocks_needed(self.block_size)
            seq.blocks = list(range(first, first + blocks))
            chunks.append((seq, 0, n))
            first, total = first + blocks, total - n
        return chunks

    @torch.inference_mode()
    def workspace_bytes(self, max_prefill_tokens: int) -> int:
        """Peak memory the largest prefill chunk (largest_chunk) and a full decode batch take beyond
        what is allocated now (CUDA: measured by running them against a scratch KV cache), summed:
        the captured decode graphs keep their memory while a prefill runs."""
        if not self.cuda:
            return 0
        chunks = self.largest_chunk(max_prefill_tokens)
        longest = chunks[0][0]
        saved = self.kv
        self.kv = KVCache(self.spec, self.block_size, 1 + sum(len(c[0].blocks) for c in chunks), self.dtype, self.device)
        peaks = []
        for run in (lambda: self.prefill(self.slots[0], chunks),
                    lambda: torch.softmax(self._decode_eager(self.slots[0], [longest] * self.max_batch).float(), dim=-1)):
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            run()
            torch.cuda.synchronize(self.device)
            peaks.append(torch.cuda.max_memory_allocated(self.device) - base)
        self.kv = saved
        torch.cuda.empty_cache()
        return int(sum(peaks))
