"""The torch engine on one GPU: the paged engine vs the eager baseline vs transformers generate.

    python benchmarks/engine_gpu.py                  # one H200: the 1.1B-class random Llama in bf16 (< 8 min)
    python benchmarks/engine_gpu.py --device cpu     # dry run here: a small model, small shapes
    python benchmarks/engine_gpu.py --json out.json --only paged-nano,paged-decode

Needs only the checkout, torch, transformers and safetensors (no pyzmq / omegaconf: nothing here
starts a dora run). Each section runs in its own process with its own timeout, so a crash or a
hang in one still prints the others; each measured run also stops itself at --cap seconds and
then reports the tokens it made by then (marked "capped").

Sections (one table at the end):
- a correctness check first: a small float32 model through the paged engine as configured on the
  device (CUDA graphs with batch padding, the Triton kernel, chunked prefill, a shared prompt),
  then again after sleep / wake / load (graphs captured anew); the worst |logprob - transformers|;
- nano-vLLM's shape: 256 requests, prompt and output lengths uniform in 100..1024, no EOS;
- GRPO's shape: 64 prompts x 8 samples (prompts uniform in 100..512), long-tailed outputs (1 in 8
  at 1024 tokens, the rest exponential with mean 128, at least 16);
  each run by the paged engine, the eager baseline (benchmarks/baselines) and HF generate
  (batches of max_batch, every row to its batch's longest output, useful tokens counted);
- decode ms per step at batch 64 and 256 (paged and eager, 128-token prompts, steady state);
- the paged engine's start-up and graph capture, the time to load a version (from host memory
  and from a safetensors file), to sleep and to wake, and the bytes sleep frees
  (torch.cuda.memory_reserved before and after).
To add a section (e.g. pipelines/gpu_single.yaml end to end, in sync and in dora mode): write a
function section_NAME(args) -> dict of measures and add NAME to SECTIONS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run from a checkout without installing

SECTIONS = ["paged-check", "paged-nano", "paged-grpo", "paged-decode", "paged-lifecycle", "eager-nano", "eager-grpo",
            "eager-decode", "hf-nano", "hf-grpo"]
SHAPES = {   # (model, nano requests and length range, grpo prompts x samples and prompt range, max output, decode batches)
    "cuda": dict(model=dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                            num_key_value_heads=4, vocab_size=32000), max_seq_len=2048, nano=(256, 100, 1024),
                 grpo=(64, 8, 100, 512), out_max=1024, tail_mean=128, decode=(64, 256), decode_prompt=128, max_batch=256),
    "cpu": dict(model=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512), max_seq_len=256, nano=(16, 8, 64),
                grpo=(4, 4, 8, 32), out_max=64, tail_mean=12, decode=(4, 16), decode_prompt=16, max_batch=16),
}


# ---------------------------------------------------------------- workloads and models
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


# ---------------------------------------------------------------- measures
def run_engine(eng, prompts: list[list[int]], lens: list[int], cap: float) -> dict:
    from dora.ops.engines.engine import SamplingRequest

    sync = _sync_fn()
    sync()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.submit(SamplingRequest(f"r{i}", p, 0, max_tokens=lens[i], temperature=1.0))
    done, steps, capped = 0, 0, False
    while eng.has_work():
        done += sum(len(c.response_ids) for c in eng.step())
        steps += 1
        if time.perf_counter() - t0 > cap:
            capped = True
            done += sum(len(st.response_ids) for st in eng.interrupt_all())
            break
    sync()
    seconds = time.perf_counter() - t0
    stats = eng.stats().to_dict()
    return {"tokens": done, "wanted": sum(lens), "seconds": seconds, "tok_s": done / seconds, "steps": steps,
            "capped": capped, **{k: stats[k] for k in ("prefill_tokens", "prefix_hit_tokens", "preempted") if k in stats}}


def run_hf(model, prompts: list[list[int]], lens: list[int], batch: int, cap: float) -> dict:
    import torch

    sync = _sync_fn()
    t0, useful, capped = time.perf_counter(), 0, False
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))   # similar lengths together: less padding
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


def decode_ms(eng, s: dict, batch: int, steps: int) -> float:
    """Steady-state ms per decode step with `batch` requests running (prefill done first)."""
    from dora.ops.engines.engine import SamplingRequest

    rnd = random.Random(batch)
    for i in range(batch):
        eng.submit(SamplingRequest(f"d{batch}-{i}", [rnd.randrange(3, s["model"]["vocab_size"])
                                                    for _ in range(s["decode_prompt"])], 0,
                                   max_tokens=s["max_seq_len"] - s["decode_prompt"] - 1, temperature=1.0))
    for _ in range(200):                  # admission and prefill (chunked on the paged engine) until all decode
        before = eng.stats().generated_tokens
        eng.step()
        if eng.stats().generated_tokens - before == batch:
            break
    eng.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()                        # (a step ends with its device-to-host copy: synchronised)
    ms = (time.perf_counter() - t0) / steps * 1000
    eng.interrupt_all()
    return ms


def _sync_fn():
    import torch
    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


# ---------------------------------------------------------------- sections (each in its own process)
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
    run_engine(eng, prompts[:2], [4, 4], args.cap)                    # warm-up (the paged engine captures its graphs)
    warmup = time.perf_counter() - t0
    return {**run_engine(eng, prompts, lens, args.cap), "start_s": start, "warmup_s": warmup}


def section_decode(args, kind: str) -> dict:
    import torch

    s, dtype = SHAPES[args.device], getattr(torch, args.dtype)
    eng = make_engine(kind, build_model(s, args.device, dtype), s, args.device, dtype)
    return {f"decode_ms_{b}": decode_ms(eng, s, b, steps=30 if kind == "paged" else 10) for b in s["decode"]}


def section_lifecycle(args) -> dict:
    """The paged engine: start-up, graph capture, version loads, sleep and wake."""
    import torch
    from dora.ops.weights.versions import save_version

    s, dtype = SHAPES[args.device], getattr(torch, args.dtype)
    model = build_model(s, args.device, dtype)
    host = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}   # what a trainer publishes
    sync, out = _sync_fn(), {}
    t0 = time.perf_counter()
    eng = make_engine("paged", model, s, args.device, dtype)
    out["start_s"] = time.perf_counter() - t0
    del model
    t0 = time.perf_counter()
    run_engine(eng, [[5, 6, 7]], [2], args.cap)                       # first decode: captures the graph ladder
    out["capture_s"] = time.perf_counter() - t0
    for v, source in ((1, host), (2, save_version(host, tempfile.mkdtemp(prefix="engine-gpu-"), 2)[0])):
        sync()
        t0 = time.perf_counter()
        eng.load_weights(v, source)
        sync()
        out["load_memory_s" if v == 1 else "load_file_s"] = time.perf_counter() - t0
    reserved = torch.cuda.memory_reserved() if torch.cuda.is_available() else 0
    t0 = time.perf_counter()
    out["sleep_bytes"] = eng.sleep()
    out["sleep_s"] = time.perf_counter() - t0
    out["reserved_freed"] = reserved - (torch.cuda.memory_reserved() if torch.cuda.is_available() else 0)
    t0 = time.perf_counter()
    eng.wake()
    out["wake_s"] = time.perf_counter() - t0
    eng.load_weights(3, host)
    t0 = time.perf_counter()
    run_engine(eng, [[5, 6, 7]], [2], args.cap)                       # graphs captured again after wake
    out["recapture_s"] = time.perf_counter() - t0
    return out


def section_check(args) -> dict:
    """Worst |logprob - a transformers forward| of the paged engine in float32, before and after sleep/wake."""
    import torch
    from dora.ops.engines.engine import SamplingRequest
    from dora.ops.engines.torch_engine import TorchEngine
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512, eos_token_id=None)
    with torch.device(args.device):
        model = LlamaForCausalLM(cfg).float().eval()
    eng = TorchEngine(model, max_batch=16, eos_ids=[], max_prefill_tokens=64, max_seq_len=512)
    rnd = random.Random(5)
    shared = [rnd.randrange(3, 1000) for _ in range(40)]
    prompts = [shared] * 6 + [[rnd.randrange(3, 1000) for _ in range(rnd.randint(2, 150))] for _ in range(5)]

    def worst() -> float:
        for i, p in enumerate(prompts):
            eng.submit(SamplingRequest(f"c{i}", p, eng.version, max_tokens=20 + i, temperature=1.0))
        out, err = {}, 0.0
        while eng.has_work():
            out.update({c.uid: c for c in eng.step()})
        for c in out.values():
            ids = torch.tensor([c.prompt_ids + c.response_ids], device=args.device)
            with torch.no_grad():
                logits = model(ids).logits[0, len(c.prompt_ids) - 1:-1].float()
            ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.response_ids, device=args.device)[:, None])
            err = max(err, (ref[:, 0].cpu() - torch.tensor(c.logprobs)).abs().max().item())
        return err

    before = worst()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    eng.sleep()
    eng.wake()
    eng.load_weights(1, weights)
    return {"logprob_err": before, "logprob_err_after_wake": worst(), "prefix_hit_tokens": eng.stats().prefix_hit_tokens}


def run_section(args, name: str) -> dict:
    import torch

    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    kind, what = name.split("-")
    if what == "check":
        return section_check(args)
    if what in ("nano", "grpo"):
        return section_shape(args, kind, what)
    if what == "decode":
        return section_decode(args, kind)
    return section_lifecycle(args)


# ---------------------------------------------------------------- the driver and the table
def spawn(args, name: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--section", name, "--device", args.device, "--dtype", args.dtype,
           "--cap", str(args.cap), "--threads", str(args.threads)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:160]}"}
    return {**json.loads(lines[-1][len("RESULT "):]), "wall_s": time.perf_counter() - t0}


def _tok(r: dict | None) -> str:
    if not r:
        return "-"
    if "error" in r:
        return "FAILED"
    return f"{r['tok_s']:,.0f}" + (" (capped)" if r.get("capped") else "")


def print_table(res: dict, args) -> None:
    def ratio(a, b):
        ok = a and b and "error" not in a and "error" not in b
        return f"{a['tok_s'] / b['tok_s']:.1f}x" if ok else "-"

    rows = [("measure", "paged", "eager", "HF generate", "paged/eager", "paged/HF")]
    check = res.get("paged-check") or {}
    for key, label in (("logprob_err", "check: max |logprob - HF|, fp32"),
                       ("logprob_err_after_wake", "check: the same after sleep/wake")):
        rows.append((label, f"{check[key]:.1e}" if key in check else "-", "", "", "", ""))
    for shape in ("nano", "grpo"):
        p, e, h = (res.get(f"{k}-{shape}") for k in ("paged", "eager", "hf"))
        rows.append((f"{shape} shape: output tok/s", _tok(p), _tok(e), _tok(h), ratio(p, e), ratio(p, h)))
    pd, ed = res.get("paged-decode") or {}, res.get("eager-decode") or {}
    for b in SHAPES[args.device]["decode"]:
        key = f"decode_ms_{b}"
        rows.append((f"decode ms/step, batch {b}", f"{pd[key]:.2f}" if key in pd else "-",
                     f"{ed[key]:.2f}" if key in ed else "-", "", "", ""))
    life = res.get("paged-lifecycle") or {}
    for key, label in (("start_s", "start-up s"), ("capture_s", "first step (graph capture) s"),
                       ("load_memory_s", "load version from memory s"), ("load_file_s", "load version from file s"),
                       ("sleep_s", "sleep s"), ("wake_s", "wake s"), ("recapture_s", "first step after wake s")):
        rows.append((label, f"{life[key]:.3f}" if key in life else "-", "", "", "", ""))
    for key, label in (("sleep_bytes", "sleep: bytes released"), ("reserved_freed", "sleep: memory_reserved freed")):
        rows.append((label, f"{life[key] / 2 ** 20:,.1f} MiB" if key in life else "-", "", "", "", ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(6)]
    for r in rows:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    for name, r in res.items():
        if "error" in r:
            print(f"{name}: {r['error']}")
    gp = res.get("paged-grpo") or {}
    if "prefix_hit_tokens" in gp:
        print(f"grpo shape, paged: {gp['prefill_tokens']:,} tokens prefilled, {gp['prefix_hit_tokens']:,} shared (prefix hits)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--cap", type=float, default=None, help="seconds a measured run may take (cuda 35, cpu 20)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds a section's process may take (cuda 120, cpu 90)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on cpu")
    ap.add_argument("--only", default=None, help=f"comma-separated sections of {SECTIONS}")
    ap.add_argument("--json", default=None)
    ap.add_argument("--section", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    a.cap = a.cap or (35.0 if a.device == "cuda" else 20.0)
    a.timeout = a.timeout or (120.0 if a.device == "cuda" else 90.0)
    if a.section:
        print("RESULT " + json.dumps(run_section(a, a.section)), flush=True)
        return
    names = a.only.split(",") if a.only else SECTIONS
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        sys.exit(f"engine_gpu: unknown sections {unknown}; known: {SECTIONS}")
    t0, res = time.perf_counter(), {}
    for name in names:
        res[name] = spawn(a, name)
        print(f"[{time.perf_counter() - t0:6.0f} s] {name}: {json.dumps(res[name])}", flush=True)
    print_table(res, a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "dtype": a.dtype, "cap": a.cap, "results": res}, f, indent=2)


if __name__ == "__main__":
    main()
