"""The tables benchmarks/engine_gpu.py prints from its results (a dict: section -> measures, or
{"skipped" | "stopped" | "error": why})."""

from __future__ import annotations

from benchmarks.engine_gpu_sections import SHAPES, SINGLE_STEPS


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _tok(r: dict | None) -> str:
    if not r or "tok_s" not in r:
        return "-" if not r or "skipped" in r else "FAILED"
    return f"{r['tok_s']:,.0f}" + (" (capped)" if r.get("capped") else "")


def _ratio(a: dict | None, b: dict | None) -> str:
    ok = a and b and "tok_s" in a and "tok_s" in b and b["tok_s"] > 0
    return f"{a['tok_s'] / b['tok_s']:.1f}x" if ok else "-"


def _rows_out(rows: list[tuple]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def engine_rows(res: dict, device: str) -> list[tuple]:
    rows = [("measure", "paged", "eager", "HF generate", "paged/eager", "paged/HF")]
    check = res.get("paged-check") or {}
    for key, label, fmt in (("bf16_max_vs_hf", "check: max |logprob - HF bf16|", ".1e"),
                            ("bf16_mean_vs_fp32", "check: mean |bf16 - fp32|, engine", ".1e"),
                            ("hf_bf16_mean_vs_fp32", "check: mean |bf16 - fp32|, HF", ".1e"),
                            ("bf16_max_vs_fp32", "check: max |bf16 - fp32|, engine", ".1e"),
                            ("hf_bf16_max_vs_fp32", "check: max |bf16 - fp32|, HF", ".1e"),
                            ("fp32_max_err", "check: max |logprob - HF|, fp32", ".1e")):
        rows.append((label, _num(check.get(key), fmt), "", "", "", ""))
    if "bf16_ok" in check:
        rows.append(("check: bf16 within tolerance", str(check["bf16_ok"]), "", "", "", ""))
        rows.append(("check: graph captures by phase", "/".join(map(str, check["graph_captures"])), "", "", "", ""))
    for shape in ("nano", "grpo"):
        p, e, h = (res.get(f"{k}-{shape}") for k in ("paged", "eager", "hf"))
        rows.append((f"{shape} shape: output tok/s", _tok(p), _tok(e), _tok(h), _ratio(p, e), _ratio(p, h)))
    pd, ed = res.get("paged-decode") or {}, res.get("eager-decode") or {}
    s = SHAPES[device]
    for context in s["contexts"]:
        for b in s["batches"]:
            key = f"decode_ms_{b}_{context}"
            rows.append((f"decode ms/step, batch {b}, context ~{context}", _num(pd.get(key), ".2f"),
                         _num(ed.get(key), ".2f"), "", "", ""))
    life = res.get("paged-lifecycle") or {}
    for key, label in (("start_s", "start-up s"), ("warm_up_s", "warm-up (graphs, kernels) s"),
                       ("load_memory_s", "load version from memory s"), ("load_file_s", "load version from file s"),
                       ("kept_sleep_s", "sleep keeping graphs s"), ("kept_wake_s", "wake (graphs kept) s"),
                       ("first_step_after_kept_wake_s", "first request after it s"), ("sleep_s", "full sleep s"),
                       ("wake_s", "wake s"), ("first_step_after_wake_s", "first request after it (captures) s"),
                       ("pool_build_4m_s", "block pool of 4M blocks s")):
        rows.append((label, _num(life.get(key), ".3f"), "", "", "", ""))
    for key, label in (("kept_sleep_bytes", "sleep keeping graphs: bytes released"),
                       ("sleep_bytes", "full sleep: bytes released"), ("reserved_freed", "full sleep: reserved freed")):
        rows.append((label, "-" if key not in life else f"{life[key] / 2 ** 20:,.1f} MiB", "", "", "", ""))
    return rows


def single_rows(res: dict) -> list[tuple]:
    rows = [("mode", "ok", "wall s", "step s", "train s", "rollout-only s", "tok/s", "sleep+wake s", "sleeps",
             "graph captures", "prefix hits", "trainer peak GiB", "engine KV tokens", "C1-C3", "lost")]
    for name, r in res.items():
        if not name.startswith("single-") or "ok" not in r:
            continue
        rows.append((name[len("single-"):], str(r["ok"]), _num(r["wall_s"], ".1f"), _num(r["step_s"], ".2f"),
                     _num(r["train_s"], ".2f"), _num(r["rollout_only_s"], ".2f"), _num(r["step_tok_s"], ",.0f"),
                     _num(r["handover_s"], ".3f"), str(r["sleeps"]), "/".join(map(str, r["graph_captures"])),
                     _num(r["prefix_hit_share"], ".0%"), _num(r["trainer_peak_gib"], ".1f"), _num(r["kv_tokens"], ",d"),
                     "/".join(str(c) for c in r["c1_c3"]), str(r["lost"])))
    return rows


def print_tables(res: dict, device: str) -> None:
    _rows_out(engine_rows(res, device))
    for name, r in res.items():
        for why in ("skipped", "stopped", "error"):
            if why in r:
                print(f"{name}: {why}: {r[why]}")
    timed = [(n, r["captures_in_timed"], r.get("compiles_in_timed")) for n, r in res.items() if "captures_in_timed" in r]
    if timed:
        print("graph captures / kernel compiles inside timed regions (0 = warm): "
              + ", ".join(f"{n} {c}/{_num(k, 'd')}" for n, c, k in timed))
    gp = res.get("paged-grpo") or {}
    if "prefix_hit_tokens" in gp:
        print(f"grpo shape, paged: {gp['prefill_tokens']:,} tokens prefilled, {gp['prefix_hit_tokens']:,} shared (prefix hits)")
    singles = single_rows(res)
    if len(singles) > 1:
        print(f"\npipelines/gpu_single.yaml, {SINGLE_STEPS} steps, rollout and trainer on one device "
              "(medians after step 1; graph captures per step line)")
        _rows_out(singles)
