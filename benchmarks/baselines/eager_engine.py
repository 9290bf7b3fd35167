"""The eager baseline engine (dora's torch engine before the paged one): continuous batching on any
transformers causal LM, with a shared padded KV cache. Kept only as the baseline that
benchmarks/generate.py and benchmarks/engine_gpu.py compare the paged engine against.

Each step(): admit queued requests (prefill all of their tokens but the last into a new
left-padded cache, or adopt an imported KV as is), append them to the running batch, run ONE
decode forward for every running request (input = each row's last token), sample, and drop the
rows that finished. Requests join and leave between any two steps; nobody waits for a batch.
See docs/architecture.md "Engines".
"""

from __future__ import annotations

import collections
import dataclasses

import torch
from transformers import DynamicCache

from dora.ops.engines.engine import Completion, Engine, EngineStats, SamplingRequest, SequenceState

from .eager_kv import BatchKV
from .eager_sampling import sample


@dataclasses.dataclass
class _Seq:
    req: SamplingRequest
    response: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None   # imported KV waiting to be adopted
    stops: frozenset[int] = frozenset()

    @property
    def last(self) -> int:
        return self.response[-1] if self.response else self.req.prompt_ids[-1]

    @property
    def tokens(self) -> list[int]:
        return self.req.prompt_ids + self.response


class EagerEngine(Engine):
    def __init__(self, model: torch.nn.Module, *, version: int = 0, max_batch: int = 64, seed: int = 0,
                 eos_ids: list[int] | None = None, max_seq_len: int | None = None):
        self.model = model.eval()
        cfg = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.version = int(version)
        self.max_batch = int(max_batch)
        self.max_seq_len = int(max_seq_len or getattr(cfg, "max_position_embeddings", 2048))
        self.n_layers = cfg.num_hidden_layers
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eos_ids = frozenset(_default_eos(model) if eos_ids is None else eos_ids)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.waiting: collections.OrderedDict[str, _Seq] = collections.OrderedDict()
        self.running: list[_Seq] = []
        self.batch: BatchKV | None = None
        self._params: tuple[torch.Tensor, ...] | None = None   # per-row sampling params, rebuilt on change
        self.reprefill_tokens = 0
        self.generated_tokens = 0
        self.asleep = False                # sleep(): parameters released (shapes kept to wake)
        self.needs_weights = False         # woken, parameters allocated but not loaded yet
        self._shapes: dict[str, torch.Size] = {}

    # ------------------------------------------------------------------ requests in
    def submit(self, req: SamplingRequest) -> None:
        self._check_awake("submit")
        req.validate()
        self._check_new(req.uid, len(req.prompt_ids) + 1)
        self.waiting[req.uid] = _Seq(req, stops=self.eos_ids | frozenset(req.stop_ids))

    def import_(self, states: list[SequenceState]) -> None:
        if states:
            self._check_awake("import_")
        for st in states:
            st.request.validate()
            n_tokens = len(st.request.prompt_ids) + len(st.response_ids)
            self._check_new(st.request.uid, n_tokens)
            seq = _Seq(st.request, list(st.response_ids), list(st.logprobs), list(st.token_versions),
                       stops=self.eos_ids | frozenset(st.request.stop_ids))
            if st.kv is not None and st.kv_version == self.version:
                self._check_kv(st, n_tokens)
                seq.kv = st.kv
            # else: KV missing or computed by other weights; _prefill recomputes it (and counts it)
            self.waiting[st.request.uid] = seq

    def _check_new(self, uid: str, n_tokens: int) -> None:
        if uid in self.waiting or any(s.req.uid == uid for s in self.running):
            raise ValueError(f"torch engine: request uid {uid!r} is already in flight")
        if n_tokens > self.max_seq_len:
            raise ValueError(f"torch engine: request {uid!r} has {n_tokens - 1} tokens; max_seq_len is {self.max_seq_len}")

    def _check_kv(self, st: SequenceState, n_tokens: int) -> None:
        uid = st.request.uid
        if len(st.kv) != self.n_layers:
            raise ValueError(f"torch engine: KV of {uid!r} has {len(st.kv)} layers, model has {self.n_layers}")
        want = (self.kv_heads, n_tokens - 1, self.head_dim)
        for k, v in st.kv:
            if tuple(k.shape) != want or tuple(v.shape) != want:
                raise ValueError(f"torch engine: KV of {uid!r} has shape {tuple(k.shape)}, expected {want} "
                                 "(kv heads, all tokens but the last, head dim)")

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def step(self) -> list[Completion]:
        self._admit()
        if not self.running:
            return []
        b = self.batch
        last = torch.tensor([[s.last] for s in self.running], device=self.device)
        positions = b.lengths()[:, None]
        b.grew_one()
        out = self.model(input_ids=last, attention_mask=b.attention_mask(), position_ids=positions,
                         past_key_values=b.cache, use_cache=True, logits_to_keep=1)
        if self._params is None:
            self._params = self._build_params()
        toks, lps = sample(out.logits[:, -1, :], *self._params, generator=self.generator)
        done: list[Completion] = []
        keep: list[int] = []
        for i, (seq, tok, lp) in enumerate(zip(self.running, toks.tolist(), lps.tolist())):
            seq.response.append(tok)
            seq.logprobs.append(lp)
            seq.versions.append(self.version)
            reason = None
            if tok in seq.stops:
                reason = "stop"
            elif len(seq.response) >= seq.req.max_tokens or len(seq.req.prompt_ids) + len(seq.response) >= self.max_seq_len:
                reason = "length"
            if reason is None:
                keep.append(i)
            else:
                done.append(_complete(seq, reason))
        self.generated_tokens += len(self.running)
        if len(keep) < len(self.running):
            self.running = [self.running[i] for i in keep]
            b.keep_rows(keep)
            self._params = None
        return done

    def _admit(self) -> None:
        free = self.max_batch - len(self.running)
        if free <= 0 or not self.waiting:
            return
        new = [self.waiting.popitem(last=False)[1] for _ in range(min(free, len(self.waiting)))]
        with_kv = [s for s in new if s.kv is not None]
        fresh = [s for s in new if s.kv is None]
        parts = []
        if fresh:
            parts.append(self._prefill(fresh))
        if with_kv:
            parts.append(BatchKV.from_rows([s.kv for s in with_kv], self.n_layers, self.kv_heads, self.head_dim,
                                           self.dtype, self.device))
            for s in with_kv:
                s.kv = None
        if not self.running:
            self.batch = None
        for part in parts:
            if self.batch is None:
                self.batch = part
            else:
                self.batch.extend(part)
        self.running += fresh + with_kv   # same order as the rows of the parts
        self._params = None

    def _prefill(self, seqs: list[_Seq]) -> BatchKV:
        """KV for all tokens but the last of each sequence, as one left-padded batch."""
        ctx = [s.tokens[:-1] for s in seqs]
        # a request that already generated tokens had this KV before (on another engine or version)
        self.reprefill_tokens += sum(len(c) for s, c in zip(seqs, ctx) if s.response)
        width = max(len(c) for c in ctx)
        if width == 0:
            return BatchKV.from_rows([[] for _ in seqs], self.n_layers, self.kv_heads, self.head_dim,
                                     self.dtype, self.device)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.bool)
        for i, c in enumerate(ctx):
            if c:
                ids[i, width - len(c):] = torch.tensor(c)
                mask[i, width - len(c):] = True
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache()
        self.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1)
        return BatchKV.from_cache(cache, mask)

    def _build_params(self) -> tuple[torch.Tensor, ...]:
        reqs = [s.req for s in self.running]
        return (torch.tensor([r.temperature for r in reqs], dtype=torch.float32, device=self.device),
                torch.tensor([r.top_p for r in reqs], dtype=torch.float32, device=self.device),
                torch.tensor([r.top_k for r in reqs], dtype=torch.long, device=self.device))

    # ------------------------------------------------------------------ requests out
    def abort(self, uid: str) -> Completion | None:
        if uid in self.waiting:
            return _complete(self.waiting.pop(uid), "abort")
        for i, s in enumerate(self.running):
            if s.req.uid == uid:
                self._drop_rows([i])
                return _complete(s, "abort")
        return None

    def export(self, uids: list[str]) -> list[SequenceState]:
        states, rows = [], []
        index = {s.req.uid: i for i, s in enumerate(self.running)}
        for uid in uids:
            if uid in self.waiting:
                s = self.waiting.pop(uid)
                states.append(_state(s, s.kv, self.version if s.kv is not None else None))
            elif uid in index:
                i = index[uid]
                rows.append(i)
                states.append(_state(self.running[i], self.batch.row_kv(i), self.version))
            else:
                raise KeyError(f"torch engine: export of unknown request uid {uid!r}")
        if rows:
            self._drop_rows(rows)
        return states

    def interrupt_all(self) -> list[SequenceState]:
        return self.export([s.req.uid for s in self.running] + list(self.waiting))

    def _drop_rows(self, rows: list[int]) -> None:
        gone = set(rows)
        keep = [i for i in range(len(self.running)) if i not in gone]
        self.running = [self.running[i] for i in keep]
        if self.running:
            self.batch.keep_rows(keep)
        else:
            self.batch = None
        self._params = None

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ weights, stats
    def load_weights(self, version: int, weights: dict[str, torch.Tensor] | str) -> None:
        if self.running or self.waiting:
            raise RuntimeError(f"torch engine: load_weights(version={version}) with {len(self.running)} running and "
                               f"{len(self.waiting)} queued requests; switch only when idle or after interrupt_all()")
        if self.asleep:
            raise RuntimeError(f"torch engine: load_weights(version={version}) while asleep; wake() first")
        load_state_dict_into(self.model, weights)
        self.version = int(version)
        self.needs_weights = False

    # ------------------------------------------------------------ sleep / wake (async.elastic)
    def sleep(self, keep_graphs: bool = False) -> int:   # (no graphs to keep: a full sleep either way)
        """Release every parameter's storage and the KV cache (on CUDA the allocator's cache too, so
        the memory really goes back to the trainer sharing the device). Buffers that are not weights
        (rotary tables: kilobytes) stay. Tied parameters are one tensor, released once."""
        if self.running or self.waiting:
            raise RuntimeError(f"torch engine: sleep() with {len(self.running)} running and {len(self.waiting)} "
                               "queued requests; export them first")
        if self.asleep:
            return 0
        freed = 0
        for name, p in self.model.named_parameters():   # (named_parameters yields a tied tensor once)
            self._shapes[name] = p.shape
            freed += p.numel() * p.element_size()
            p.data = p.data.new_empty(0)
        self.batch, self._params = None, None
        self.asleep = True
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return freed

    def wake(self) -> int:
        """Allocate the parameters again (contents undefined until load_weights)."""
        if not self.asleep:
            return 0
        params = dict(self.model.named_parameters())
        allocated = 0
        for name, shape in self._shapes.items():
            p = params[name]
            p.data = torch.empty(shape, dtype=p.dtype, device=self.device)
            allocated += p.numel() * p.element_size()
        self.asleep, self.needs_weights = False, True
        return allocated

    def _check_awake(self, what: str) -> None:
        if self.asleep or self.needs_weights:
            raise RuntimeError(f"torch engine: {what}() while {'asleep' if self.asleep else 'woken without weights'}; "
                               "wake() and load_weights() first")

    def sampling_state(self) -> bytes:
        return self.generator.get_state().numpy().tobytes()

    def set_sampling_state(self, state: bytes) -> None:
        self.generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))

    def stats(self) -> EngineStats:
        used = int(self.batch.mask.sum()) if self.batch is not None and self.running else 0
        return EngineStats(active=len(self.running), queued=len(self.waiting), kv_tokens_used=used,
                           kv_tokens_capacity=self.max_batch * self.max_seq_len, version=self.version,
                           reprefill_tokens=self.reprefill_tokens, generated_tokens=self.generated_tokens)


def _complete(s: _Seq, reason: str) -> Completion:
    return Completion(s.req.uid, list(s.req.prompt_ids), s.response, s.logprobs, s.versions, s.req.version,
                      reason, s.req.meta)


def _state(s: _Seq, kv, kv_version) -> SequenceState:
    return SequenceState(s.req, list(s.response), list(s.logprobs), list(s.versions), kv, kv_version)


def _default_eos(model: torch.nn.Module) -> list[int]:
    for cfg in (getattr(model, "generation_config", None), model.config):
        eos = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


def load_state_dict_into(model: torch.nn.Module, weights: dict[str, torch.Tensor] | str) -> None:
    """Copy weights (a state dict or a safetensors file) into model in place; strict except for tied heads."""
    if isinstance(weights, str):
        from dora.ops.weights.versions import read_version   # restores tied aliases stored once by save_version
        weights = read_version(weights)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"load_weights: state dict does not fit {type(model).__name__}: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
