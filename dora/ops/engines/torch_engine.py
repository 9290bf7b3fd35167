"""The torch engine: paged KV cache, continuous batching, CUDA-graph decode, sampling on the device.

Each step(): admit queued requests (each gets its KV blocks; cached prompt blocks are shared),
prefill up to `max_prefill_tokens` context tokens, then ONE decode step for every running request
(on CUDA a captured graph per batch size, a Triton kernel reading the KV blocks in place), sample
on the device and copy (tokens, logprobs) to the host once. Requests join and leave between any
two steps without touching anyone else's KV. The pieces live in paged/ (model, blocks, scheduler,
attention, graphs, weights); see docs/architecture.md "Engines".
"""

from __future__ import annotations

import torch

from .engine import Completion, Engine, EngineStats, SamplingRequest, SequenceState
from .paged import hf_weights as W, sleep_wake
from .paged.blocks import BlockPool
from .paged.checks import check_kv, check_request
from .paged.kv_budget import budget_blocks, initial_blocks
from .paged.kv_cache import KVCache
from .paged.model_spec import spec_of
from .paged.runner import ModelRunner
from .paged.scheduler import Scheduler
from .paged.sequence import Seq
from .paged.weight_slots import WeightSlots
from .sampling import SamplePlan, sample, sampling_tensors

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TorchEngine(Engine):
    def __init__(self, model: torch.nn.Module, *, version: int = 0, max_batch: int = 64, seed: int = 0,
                 eos_ids: list[int] | None = None, max_seq_len: int | None = None, dtype: str | torch.dtype | None = None,
                 device: str | torch.device | None = None, kv_cache_gb: float | None = None, memory_fraction: float | None = None,
                 block_size: int = 16, max_prefill_tokens: int = 4096, cuda_graphs: bool = True, max_versions: int = 1,
                 attention: str | None = None):
        """model: a transformers llama/qwen2 causal LM whose weights (and config) the engine copies.
        memory_fraction: this replica's share of its device's memory, which the KV pool is sized from
        when kv_cache_gb is None (None: 0.9 on CUDA; on CPU room for max_batch requests); see
        paged/kv_budget.py. max_versions: policy versions hosted at once (paged/weight_slots.py); the
        derived KV budget leaves room for that many weight copies. attention: 'triton' (the paged
        kernel; default on CUDA) or 'torch' (default elsewhere)."""
        self.spec = spec_of(model.config)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype or next(model.parameters()).dtype
        self.max_batch = int(max_batch)
        self.max_seq_len = int(max_seq_len or self.spec.max_positions)
        self.block_size = int(block_size)
        self.eos_ids = frozenset(_default_eos(model) if eos_ids is None else eos_ids)
        self.runner = ModelRunner(self.spec, model.config, dtype=self.dtype, device=self.device, max_batch=self.max_batch,
                                  max_seq_len=self.max_seq_len, block_size=self.block_size, cuda_graphs=cuda_graphs,
                                  attention=attention)
        W.load_into(self.runner.new_slot().model, model.state_dict())
        self.runner.slots[0].version = self.version = int(version)
        self.slots = WeightSlots(self.runner, max_versions, release_memory=self.device.type != "cuda")
        self.max_versions = self.slots.max_versions
        self.budget = budget_blocks(self.spec, block_size=self.block_size, dtype=self.dtype, device=self.device,
                                    max_batch=self.max_batch, max_seq_len=self.max_seq_len, kv_cache_gb=kv_cache_gb,
                                    memory_fraction=memory_fraction, weight_bytes=self.weight_bytes(),
                                    workspace=self.runner.workspace_bytes(max_prefill_tokens),
                                    weight_copies=self.max_versions)
        self.sched = Scheduler(BlockPool(2, self.block_size), max_batch=self.max_batch,
                               max_prefill_tokens=int(max_prefill_tokens), version_of=lambda i: self.runner.slots[i].version,
                               grow=self._grow, write_kv=self._write_kv,
                               copy_kv=lambda src, dst, n: self.runner.kv.copy_slots(src, dst, n))
        self.allocate_kv()
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.generated_tokens = 0
        self.asleep = False                # sleep(): weights and KV released (or kept, with the graphs)
        self.kept_memory = False           # asleep, the graphs and what they point to kept
        self.needs_weights = False         # woken: weights allocated, not loaded yet

    # ------------------------------------------------------------------ requests in
    def submit(self, req: SamplingRequest) -> None:
        self._check_awake("submit")
        req.validate()
        self._check_new(req.uid, req.prompt_ids, 1)
        seq = Seq(req, stops=self.eos_ids | frozenset(req.stop_ids), slot=self.slots.route(req.version))
        parked = self.sched.parked.get(req.continues) if req.continues is not None else None
        if parked is not None and seq.tokens[:len(parked.tokens)] != parked.tokens:
            raise ValueError(f"torch engine: request {req.uid!r} continues {req.continues!r} but its prompt_ids do "
                             f"not start with that request's {len(parked.tokens)} prompt + response tokens")
        if parked is not None:
            del self.sched.parked[req.continues]
            if parked.kv_version == self.runner.slots[seq.slot].version:
                seq.adopt = parked
            else:
                self.sched.pool.release(parked.blocks)
        # no usable parked KV (dropped, released, another version): prefilled in full, and counted
        seq.lost_parked = req.continues is not None and seq.adopt is None
        self.sched.waiting[req.uid] = seq

    def import_(self, states: list[SequenceState]) -> None:
        if states:
            self._check_awake("import_")
        for st in states:
            st.request.validate()
            self._check_new(st.request.uid, st.request.prompt_ids, len(st.response_ids))
            slot = self.slots.route(st.kv_version if st.kv is not None else st.request.version)
            seq = Seq(st.request, stops=self.eos_ids | frozenset(st.request.stop_ids), response=list(st.response_ids),
                      logprobs=list(st.logprobs), versions=list(st.token_versions), slot=slot)
            if st.kv is not None and st.kv_version == self.runner.slots[slot].version:
                check_kv(st, self.spec)
                seq.pending_kv = st.kv
            else:   # KV missing or computed by other weights: prefilled again here, and counted
                seq.reprefill = bool(seq.response)
            self.sched.waiting[st.request.uid] = seq

    def _check_new(self, uid: str, prompt: list[int], more: int) -> None:
        check_request(uid, prompt, more, in_flight=self.sched.find(uid) is not None, vocab=self.spec.vocab,
                      max_seq_len=self.max_seq_len)

    def _write_kv(self, seq: Seq) -> None:
        seq.computed = self.runner.kv.write(seq.blocks, seq.pending_kv)
        seq.pending_kv = None

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def step(self) -> list[Completion]:
        sched = self.sched
        sched.admit()
        chunks = sched.prefill_chunks()
        sched.prefilled(chunks)          # (bookkeeping: the forward below computes what it records)
        if sched.running:
            sched.reserve_decode()
        slots = len(self.runner.slots)
        groups = _by_slot(sched.running, lambda s: s.slot, slots)
        order = [seq for seqs in groups.values() for seq in seqs]
        reqs = [s.req for s in order]
        temps, top_ps, top_ks = [r.temperature for r in reqs], [r.top_p for r in reqs], [r.top_k for r in reqs]
        params = sampling_tensors(temps, top_ps, top_ks, self.device) if order else None   # copied while the GPU idles
        for slot, part in _by_slot(chunks, lambda c: c[0].slot, slots).items():
            self.runner.prefill(self.runner.slots[slot], part)
        if not order:
            return []
        logits = [self.runner.decode(self.runner.slots[slot], seqs) for slot, seqs in groups.items()]
        tokens, logprobs = sample(torch.cat(logits) if len(logits) > 1 else logits[0], *params, self.generator,
                                  SamplePlan.of(temps, top_ps, top_ks))
        sampled = torch.stack([tokens.double(), logprobs.double()], dim=1).tolist()   # the step's one device-to-host copy
        return self._advance(order, sampled)

    def _advance(self, order: list[Seq], sampled: list[list[float]]) -> list[Completion]:
        """Append each sampled token (the decode wrote the KV of the token each row fed). A hot loop:
        seal only where a block filled, finish the done ones at once."""
        bs, max_len, versions = self.block_size, self.max_seq_len, [slot.version for slot in self.runner.slots]
        finished, done = [], []
        for seq, (token, logprob) in zip(order, sampled):
            token = int(token)
            seq.computed += 1
            seq.response.append(token)
            seq.logprobs.append(logprob)
            seq.versions.append(versions[seq.slot])
            seq.tokens.append(token)
            if seq.computed % bs == 0:
                self.sched.seal(seq)
            if token in seq.stops or len(seq.response) >= seq.req.max_tokens or len(seq.tokens) >= max_len:
                finished.append(seq)
                done.append(seq.completion(seq.finish_reason(max_len)))
        self.sched.finish(finished)
        self.generated_tokens += len(order)
        if finished:
            self._retire()
        return done

    # ------------------------------------------------------------------ requests out
    def abort(self, uid: str) -> Completion | None:
        seq = self.sched.find(uid)
        if seq is None:
            return None
        self.sched.remove(seq)
        self._retire()
        return seq.completion("abort")

    def export(self, uids: list[str]) -> list[SequenceState]:
        seqs = []
        for uid in uids:
            seq = self.sched.find(uid)
            if seq is None:
                raise KeyError(f"torch engine: export of unknown request uid {uid!r}")
            seqs.append(seq)
        states = []
        for seq in seqs:
            kv = seq.pending_kv if seq.pending_kv is not None else (
                self.runner.kv.read(seq.blocks, seq.computed) if seq.computed else None)
            states.append(seq.state(kv, self.runner.slots[seq.slot].version))
            self.sched.remove(seq)
        self._retire()
        return states

    def interrupt_all(self) -> list[SequenceState]:
        return self.export([s.uid for s in self.sched.in_flight()])

    def release(self, uid: str) -> bool:
        released = self.sched.release(uid)
        self._retire()
        return released

    def has_work(self) -> bool:
        return bool(self.sched.waiting or self.sched.running or self.sched.prefilling)

    # ------------------------------------------------------------------ weights and memory
    def load_weights(self, version: int, weights: dict[str, torch.Tensor] | str) -> None:
        if self.asleep:
            raise RuntimeError(f"torch engine: load_weights(version={version}) while asleep; wake() first")
        self.slots.load(int(version), weights, self.sched, self.keep_versions())
        self.version, self.needs_weights = int(version), False
        self._retire()                     # the previous version, if nothing of it is left here

    def hosted_versions(self) -> list[int]:
        self._retire()
        return self.slots.hosted()

    def _retire(self) -> None:
        """An older version whose last request here left goes (paged/weight_slots.py)."""
        self.slots.retire_idle(self.sched, self.keep_versions())

    def sleep(self, keep_graphs: bool = False) -> int:
        """Hand the memory back, only when idle; keep_graphs: keep what the captured graphs point to
        (paged/sleep_wake.py says what goes and what stays). Returns the bytes released."""
        return sleep_wake.sleep(self, keep_graphs)

    def wake(self) -> int:
        """Take the memory again (weights undefined until load_weights); the bytes allocated."""
        return sleep_wake.wake(self)

    def warm_up(self) -> None:
        """Capture the decode graphs of every hosted version and compile the attention kernel's
        variants now, instead of at the first requests (benchmarks time no compile this way)."""
        self._check_awake("warm_up")
        if self.has_work():
            raise RuntimeError("torch engine: warm_up() with requests in flight")
        self.runner.warm_up(self.sched.pool)

    def allocate_kv(self) -> None:
        """A fresh KV tensor of the budget's initial size and an empty block pool over it."""
        blocks = 1 + initial_blocks(self.device, self.budget)
        self.runner.kv = KVCache(self.spec, self.block_size, blocks, self.dtype, self.device)
        self.sched.pool = BlockPool(blocks, self.block_size)

    def _grow(self, want: int) -> bool:
        """CPU: double the KV tensor (at least `want` more blocks) up to the budget."""
        have = self.sched.pool.num_blocks
        if self.device.type == "cuda" or have >= self.budget + 1:
            return False
        blocks = min(self.budget + 1, max(2 * have, have + want))
        self.runner.kv.grow(blocks)
        self.sched.pool.grow(blocks)
        return True

    def weight_bytes(self) -> int:
        return self.slots.weight_bytes()

    def weights(self) -> dict[str, torch.Tensor]:
        """The newest version's weights under transformers' names (views)."""
        return W.hf_views(self.runner.slots[self.slots.latest].model)

    def _check_awake(self, what: str) -> None:
        if self.asleep or self.needs_weights:
            raise RuntimeError(f"torch engine: {what}() while {'asleep' if self.asleep else 'woken without weights'}; "
                               "wake() and load_weights() first")

    def sampling_state(self) -> bytes:
        return self.generator.get_state().numpy().tobytes()

    def set_sampling_state(self, state: bytes) -> None:
        self.generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))

    def stats(self) -> EngineStats:
        st = self.sched.stats(budget=self.budget, version=self.version, generated_tokens=self.generated_tokens)
        st.graph_captures = self.runner.graph_captures
        return st


def _by_slot(items: list, slot_of, slots: int) -> dict[int, list]:
    """Items grouped by weight slot (one group per hosted version with work), in order."""
    if slots == 1:
        return {0: items} if items else {}
    groups: dict[int, list] = {}
    for item in items:
        groups.setdefault(slot_of(item), []).append(item)
    return groups


def _default_eos(model: torch.nn.Module) -> list[int]:
    for cfg in (getattr(model, "generation_config", None), model.config):
        eos = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []
