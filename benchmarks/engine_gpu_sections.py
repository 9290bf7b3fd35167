"""The sections of benchmarks/engine_gpu.py: each a function of the run's arguments returning a dict of
measures, run by the driver in a process of its own.

Timed regions hold no compile and no export: the paged engine captures its graph ladder and compiles
its kernel variants (`TorchEngine.warm_up`) and runs a short warm-up workload before the clock
starts; a run that reaches its cap stops the clock first and only then drops its requests (abort:
no KV export to the host at all); tokens are the engine's own count of sampled tokens. Each
timed result carries `captures_in_timed` and `compiles_in_timed` (graph captures, Triton kernel
variants compiled while the clock ran): 0 is what "warm" means.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SINGLE_STEPS = 3
SINGLE_ON_CPU = ["pools.gpu.device=cpu", "model={arch: llama, hidden: 64, layers: 2, heads: 4, kv_heads: 2, "
                 "intermediate: 128, max_positions: 512, init_std: 0.05, tokenizer: chars}",
                 "nodes.rollout.params.dtype=float32", "nodes.train.params.precision=fp32", "async.train_batch=16",
                 "async.rollout_batch=16", "nodes.prompts.params.group_size=4", "nodes.rollout.params.max_tokens=16",
                 "nodes.rollout.params.max_batch=16"]
SHAPES = {   # model; nano requests and length range; grpo prompts x samples and prompt range; outputs; decode
    "cuda": dict(model=dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                            num_key_value_heads=4, vocab_size=32000), max_seq_len=2048, nano=(256, 100, 1024),
                 grpo=(64, 8, 100, 512), out_max=1024, tail_mean=128, batches=(64, 256), contexts=(150, 900),
                 decode_steps=30, max_batch=256, check=dict(hidden=256, layers=4, vocab=1000)),
    "cpu": dict(model=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512), max_seq_len=256, nano=(16, 8, 64),
                grpo=(4, 4, 8, 32), out_max=64, tail_mean=12, batches=(4, 16), contexts=(24, 96),
                decode_steps=8, max_batch=16, check=dict(hidden=64, layers=2, vocab=128)),
}


# ---------------------------------------------------------------- workloads, models, engines
def nano_shape(s: dict) -> tuple[list[list[int]], list[int]]:
    rnd = random.Random(0)
    n, lo, hi = s["nano"]
    vocab = s["model"]["vocab_size"]
    prompts = [[rnd.randrange(3, vocab) for _ in range(rnd.randint(lo, hi))] for _ in range(n)]
    return prompts, [rnd.randint(lo, hi) for _ in range(n)]


def grpo_shape(s: dict) -> tuple[list[list[int]], list[int]]:
    rnd = random.Random(1)
    groups, g, lo, hi = s["grpo"]
    vocab = s["model"]["vocab_size"]
    prompts, lens = [], []
    for _ in range(groups):
        prompt = [rnd.randrange(3, vocab) for _ in range(rnd.randint(lo, hi))]
        for i in range(g):
            prompts.append(prompt)
            lens.append(s["out_max"] if i == 0 else min(s["out_max"], max(16, int(rnd.expovariate(1 / s["tail_mean"])))))
    return prompts, lens


def build_model(s: dict, device: str, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**s["model"], max_position_embeddings=2 * s["max_seq_len"], eos_token_id=None,
                      bos_token_id=None, pad_token_id=0, initializer_range=0.02)
    with torch.device(device):
        return LlamaForCausalLM(cfg).to(dtype).eval()


def make_engine(kind: str, model, s: dict, device: str, dtype):
    if kind == "paged":
        from dora.ops.engines.torch_engine import TorchEngine
        return TorchEngine(model, max_batch=s["max_batch"], eos_ids=[], max_seq_len=s["max_seq_len"], dtype=dtype,
                           device=device)
    from benchmarks.baselines.eager_engine import EagerEngine
    return EagerEngine(model, max_batch=s["max_batch"], eos_ids=[], max_seq_len=s["max_seq_len"])


def sync() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def kernel_variants() -> int | None:
    """Variants of the Triton decode kernel compiled in this process (None: not measurable here)."""
    try:
        from dora.ops.engines.paged.triton_decode import _decode_kernel
        return sum(len(cache[0]) for cache in _decode_kernel.device_caches.values())
    except Exception:   # no triton, the interpreter, or a Triton whose caches look otherwise
        return None


def counters(eng) -> tuple[int, int | None]:
    return eng.stats().graph_captures, kernel_variants()


def warm(eng) -> None:
    """Untimed: the paged engine's graphs and kernel variants, then a short workload on any engine."""
    if hasattr(eng, "warm_up"):
        eng.warm_up()
    timed_run(eng, [[5, 6, 7], [8] * 40], [4, 4], cap=60.0)


def timed_run(eng, prompts: list[list[int]], lens: list[int], cap: float) -> dict:
    """Serve every request, or stop at `cap` seconds: the clock stops before the rest are dropped."""
    from dora.ops.engines.engine import SamplingRequest

    before, generated = counters(eng), eng.stats().generated_tokens
    sync()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"t{i}", p, eng.version, max_tokens=lens[i], temperature=1.0))
    steps, capped = 0, False
    while eng.has_work():
        eng.step()
        steps += 1
        if time.perf_counter() - t0 > cap:
            capped = True
            break
    sync()
    seconds = time.perf_counter() - t0
    tokens, after = eng.stats().generated_tokens - generated, counters(eng)
    if capped:
        for i in range(len(prompts)):
            eng.abort(f"t{i}")
    stats = eng.stats().to_dict()
    return {"tokens": tokens, "wanted": sum(lens), "seconds": seconds, "tok_s": tokens / seconds, "steps": steps,
            "capped": capped, "captures_in_timed": after[0] - before[0],
            "compiles_in_timed": None if before[1] is None else after[1] - before[1],
            **{k: stats[k] for k in ("prefill_tokens", "prefix_hit_tokens", "preempted") if k in stats}}


def run_hf(model, prompts: list[list[int]], lens: list[int], batch: int, cap: float) -> dict:
    """transformers generate in batches of `batch` (similar lengths together), every row to its
    batch's longest output; useful tokens counted."""
    import torch

    sync()
    t0, useful, capped = time.perf_counter(), 0, False
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[r, width - len(prompts[i]):] = 1
        new = max(lens[i] for i in idx)
        left = cap - (time.perf_counter() - t0)
        with torch.inference_mode():
            out = model.generate(ids.to(model.device), attention_mask=mask.to(model.device), do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new, min_new_tokens=new,
                                 pad_token_id=0, max_time=max(left, 1.0))
        made = out.shape[1] - width
        useful += sum(min(made, lens[i]) for i in idx)
        if made < new or time.perf_counter() - t0 > cap:
            capped = start + batch < len(order) or made < new
            break
    sync()
    seconds = time.perf_counter() - t0
    return {"tokens": useful, "wanted": sum(lens), "seconds": seconds, "tok_s": useful / seconds, "capped": capped}


def decode_ms(eng, s: dict, batch: int, context: int, steps: int) -> dict:
    """Steady-state ms per decode step with `batch` requests running at about `context` tokens."""
    from dora.ops.engines.engine import SamplingRequest

    rnd = random.Random(batch + context)
    prompt = max(2, context - steps // 2 - 4)
    uids = [f"d{batch}-{context}-{i}" for i in range(batch)]
    for uid in uids:
        eng.submit(SamplingRequest(uid, [rnd.randrange(3, s["model"]["vocab_size"])
                                                               for _ in range(prompt)], eng.version,
                                   max_tokens=s["max_seq_len"] - prompt - 1, temperature=1.0))
    for _ in range(10_000):               # admission and prefill (chunked on the paged engine) until all decode
        before = eng.stats().generated_tokens
        eng.step()
        if eng.stats().generated_tokens - before == batch:
            break
    for _ in range(3):
        eng.step()
    before = counters(eng)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()                        # (a step ends with its device-to-host copy: synchronised)
    ms = (time.perf_counter() - t0) / steps * 1000
    after = counters(eng)
    for uid in uids:
        eng.abort(uid)
    return {"ms": ms, "captures_in_timed": after[0] - before[0],
            "compiles_in_timed": None if before[1] is None else after[1] - before[1]}


# ---------------------------------------------------------------- sections
def section_check(args) -> dict:
    """bf16 correctness of the paged engine as configured on the device, before and after a version
    load and both kinds of sleep (benchmarks/engine_check.py), with the graph captures of each phase;
    and the float32 engine's worst |logprob - transformers|."""
    import torch

    from benchmarks.engine_check import bf16_errors, check_models, check_prompts
    from dora.ops.engines.torch_engine import TorchEngine
    from dora.ops.weights.versions import save_version

    s = SHAPES[args.device]["check"]
    models = check_models(args.device, **s)
    fp32, bf16 = models
    prompts = check_prompts(s["vocab"], n=10, group=6, longest=150)
    eng = TorchEngine(bf16, max_batch=16, eos_ids=[], max_prefill_tokens=64, max_seq_len=512, dtype="bfloat16")
    eng.warm_up()
    host = {k: v.detach().to("cpu", torch.float32) for k, v in fp32.state_dict().items()}
    phases, captures = {"first": bf16_errors(eng, models, prompts, "a")}, [eng.stats().graph_captures]
    eng.load_weights(1, save_version(host, tempfile.mkdtemp(prefix="engine-gpu-check-"), 1)[0])
    phases["loaded"] = bf16_errors(eng, models, prompts, "b")
    captures.append(eng.stats().graph_captures)
    for keep in (True, False):
        eng.sleep(keep_graphs=keep)
        eng.wake()
        eng.load_weights(2 + keep, host)
        phases["kept" if keep else "full"] = bf16_errors(eng, models, prompts, f"c{keep}")
        captures.append(eng.stats().graph_captures)
    exact = TorchEngine(fp32, max_batch=16, eos_ids=[], max_prefill_tokens=64, max_seq_len=512)
    fp32_err = bf16_errors(exact, (fp32, fp32), prompts, "f")
    return {"bf16_ok": all(e.ok for e in phases.values()),
            "bf16_max_vs_hf": max(e.max_vs_hf_bf16 for e in phases.values()),
            "bf16_mean_vs_fp32": max(e.mean_vs_fp32 for e in phases.values()),
            "hf_bf16_mean_vs_fp32": max(e.hf_bf16_mean_vs_fp32 for e in phases.values()),
            "bf16_max_vs_fp32": max(e.max_vs_fp32 for e in phases.values()),
            "hf_bf16_max_vs_fp32": max(e.hf_bf16_max_vs_fp32 for e in phases.values()),
            "fp32_max_err": fp32_err.max_vs_hf_bf16, "graph_captures": captures,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "phases": {k: vars(e) for k, e in phases.items()}}


def section_shape(args, kind: str, shape: str) -> dict:
    import torch

    s, dtype = SHAPES[args.device], getattr(torch, args.dtype)
    model = build_model(s, args.device, dtype)
    prompts, lens = (nano_shape if shape == "nano" else grpo_shape)(s)
    if kind == "hf":
        run_hf(model, prompts[:2], [4, 4], 2, args.cap)               # warm-up
        return run_hf(model, prompts, lens, s["max_batch"], args.cap)
    t0 = time.perf_counter()
    eng = make_engine(kind, model, s, args.device, dtype)
    del model
    start = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm(eng)
    return {**timed_run(eng, prompts, lens, args.cap), "start_s": start, "warmup_s": time.perf_counter() - t0}


def section_decode(args, kind: str) -> dict:
    import torch

    s, dtype = SHAPES[args.device], getattr(torch, args.dtype)
    eng = make_engine(kind, build_model(s, args.device, dtype), s, args.device, dtype)
    warm(eng)
    out = {}
    for context in s["contexts"]:
        for batch in s["batches"]:
            r = decode_ms(eng, s, batch, context, steps=s["decode_steps"] if kind == "paged" else 10)
            out[f"decode_ms_{batch}_{context}"] = r["ms"]
            out["captures_in_timed"] = out.get("captures_in_timed", 0) + r["captures_in_timed"]
            if r["compiles_in_timed"] is not None:
                out["compiles_in_timed"] = out.get("compiles_in_timed", 0) + r["compiles_in_timed"]
    return out


def section_lifecycle(args) -> dict:
    """The paged engine: start-up, warm-up, version loads, both kinds of sleep and wake, and the
    KV block pool's build time at 4M blocks."""
    import torch

    from dora.ops.engines.paged.blocks import BlockPool
    from dora.ops.weights.versions import save_version

    s, dtype = SHAPES[args.device], getattr(torch, args.dtype)
    model = build_model(s, args.device, dtype)
    host = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}   # what a trainer publishes
    out = {}

    def clock(key, fn):
        sync()
        t0 = time.perf_counter()
        got = fn()
        sync()
        out[key] = time.perf_counter() - t0
        return got
    eng = clock("start_s", lambda: make_engine("paged", model, s, args.device, dtype))
    del model
    clock("warm_up_s", eng.warm_up)
    out["graph_captures"] = eng.stats().graph_captures
    clock("load_memory_s", lambda: eng.load_weights(1, host))
    path = save_version(host, tempfile.mkdtemp(prefix="engine-gpu-"), 2)[0]
    clock("load_file_s", lambda: eng.load_weights(2, path))
    reserved = torch.cuda.memory_reserved() if torch.cuda.is_available() else 0
    out["kept_sleep_bytes"] = clock("kept_sleep_s", lambda: eng.sleep(keep_graphs=True))
    clock("kept_wake_s", eng.wake)
    eng.load_weights(3, host)
    clock("first_step_after_kept_wake_s", lambda: timed_run(eng, [[5, 6, 7]], [2], args.cap))
    out["sleep_bytes"] = clock("sleep_s", eng.sleep)
    out["reserved_freed"] = reserved - (torch.cuda.memory_reserved() if torch.cuda.is_available() else 0)
    clock("wake_s", eng.wake)
    eng.load_weights(4, host)
    clock("first_step_after_wake_s", lambda: timed_run(eng, [[5, 6, 7]], [2], args.cap))   # captures again
    out["graph_captures_after"] = eng.stats().graph_captures
    clock("pool_build_4m_s", lambda: BlockPool(4_000_000, 16))
    return out


def section_single(args, mode: str) -> dict:
    """pipelines/gpu_single.yaml, SINGLE_STEPS steps in `mode`: a real `dora run` (its own processes)."""
    import importlib.util

    if importlib.util.find_spec("zmq") is None:   # (omegaconf only for ${...} interpolation, which gpu_single has none of)
        raise RuntimeError("dora run needs pyzmq: install the wheels of ../shared/GPU.md and put them on PYTHONPATH")
    out = tempfile.mkdtemp(prefix=f"engine-gpu-single-{mode}-")
    cmd = [sys.executable, "-m", "dora.cli", "run", os.path.join(ROOT, "pipelines", "gpu_single.yaml"),
           f"async.mode={mode}", f"nodes.train.params.steps={SINGLE_STEPS}", *(SINGLE_ON_CPU if args.device == "cpu" else []),
           "--out", out, "--quiet", "--deadline", str(max(30.0, args.single_timeout - 20))]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.single_timeout)
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):
        raise RuntimeError(f"dora run exit {proc.returncode}, no summary: {(proc.stderr or proc.stdout)[-300:]}")
    with open(path) as f:
        summary = json.load(f)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out, "state.json")) as f:
        kv = [r["kv_capacity"] for r in json.load(f)["replicas"] if r["node"] == "rollout"]
    return {"exit": proc.returncode, "ok": summary.get("ok"), "run_error": summary.get("error"),
            "wall_s": summary.get("wall_s"), "steps": summary.get("steps"), **_step_medians(lines[1:]),
            "graph_captures": [r.get("graph_captures") for r in lines],
            "prefix_hit_share": _hit_share(lines), "sleeps": (summary.get("shared_devices") or {}).get("sleeps", 0),
            "trainer_peak_gib": max((r.get("cuda_peak_reserved_gib") or 0 for r in lines), default=0),
            "kv_tokens": kv[0] if kv else None, "c1_c3": [summary.get("accounting", {}).get(f"c{i}_violations")
                                                          for i in (1, 2, 3)],
            "lost": summary.get("accounting", {}).get("lost"), "trained": summary.get("accounting", {}).get("trained")}


def _step_medians(lines: list[dict]) -> dict:
    """Medians over the steps after the first (start-up is the first's)."""
    def median(key: str) -> float | None:
        vals = [r[key] for r in lines if r.get(key) is not None]
        return statistics.median(vals) if vals else None
    handover = [(r.get("shared_sleep_s") or 0) + (r.get("shared_wake_s") or 0) for r in lines if "shared_sleep_s" in r]
    return {"step_s": median("step_time_s"), "train_s": median("train_s"), "rollout_only_s": median("rollout_only_s"),
            "step_tok_s": median("tokens_per_s"), "handover_s": statistics.median(handover) if handover else None}


def _hit_share(lines: list[dict]) -> float | None:
    hits, computed = sum(r.get("prefix_hit_tokens", 0) for r in lines), sum(r.get("prefill_tokens", 0) for r in lines)
    return hits / (hits + computed) if hits + computed else None


def run_section(args, name: str) -> dict:
    import torch

    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    kind, what = name.split("-")
    if kind == "single":
        return section_single(args, what)
    if what == "check":
        return section_check(args)
    if what in ("nano", "grpo"):
        return section_shape(args, kind, what)
    if what == "decode":
        return section_decode(args, kind)
    return section_lifecycle(args)
