"""Where step records go besides metrics.jsonl: TensorBoard and Weights & Biases (offline).

`run.loggers` names them (checked, with their packages, by dora/graph/loggers.py). Each sink
gets every numeric value of every step record under its metrics.jsonl key, at the record's
`step`:

    tensorboard   event files under RUN_DIR/tb        (torch.utils.tensorboard; needs `tensorboard`)
    wandb         a W&B run under RUN_DIR/wandb: offline by default (`wandb sync RUN_DIR/wandb/offline-run-*`
                  uploads it), online when run.wandb.mode or WANDB_MODE says so; project, entity and
                  name from run.wandb, else WANDB_*, else the pipeline's and the run folder's names

Held-out evaluations (eval.jsonl) reach them as eval/<set>/<metric> at the version evaluated (W&B:
against eval/version, its own step only grows), and samples.jsonl's rows as one W&B table.
A sink that fails mid-run is reported once and closed; metrics.jsonl still has every record.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers (bools, strings, lists and nulls are not curves)."""
    out = {}
    for k, v in record.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v) if isinstance(v, float) else v
    return out


def eval_scalars(record: dict[str, Any]) -> dict[str, float]:
    """An eval.jsonl line's metrics under their logger names, eval/<set>/<metric>."""
    from dora.graph.eval_check import EVAL_METRICS
    return {f"eval/{record['set']}/{m}": v for m, v in scalars(record).items() if m in EVAL_METRICS}


def sample_columns() -> list[str]:
    return ["kind", "step", "version", "set", "prompt", "response", "reward", "finish_reason"]


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, run_dir: str, run_name: str, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=os.path.join(run_dir, "tb"), flush_secs=5)
        self.writer.add_text("run", f"{run_name}: " + ", ".join(f"{k}={v}" for k, v in config.items()), 0)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for k, v in scalars(record).items():
            if k != "step":
                self.writer.add_scalar(k, v, step)

    def write_eval(self, record: dict[str, Any]) -> None:
        for k, v in eval_scalars(record).items():
            self.writer.add_scalar(k, v, int(record["version"]))

    def write_samples(self, rows: list[dict[str, Any]]) -> None:
        pass   # (samples.jsonl and W&B's table hold them; TensorBoard keeps curves)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    name = "wandb"

    def __init__(self, run_dir: str, run_name: str, config: dict[str, Any], options: dict[str, Any] | None = None):
        import wandb

        from dora.graph.loggers import wandb_run

        # offline unless asked: no account, no network; everything stays in RUN_DIR/wandb
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False,
                                  disable_git=True, x_disable_meta=True)
        where = wandb_run(options or {}, run_name, os.path.basename(os.path.abspath(run_dir)))
        self.run = wandb.init(**where, dir=run_dir, config=config, settings=settings, reinit="create_new")
        self.eval_axis, self.samples = False, []
        self.step, self.in_row, self.deferred = 0, set(), []   # W&B's open row: its step, the sets in it

    def write(self, record: dict[str, Any]) -> None:
        self.step = int(record["step"])
        self.run.log({k: v for k, v in scalars(record).items() if k != "step"}, step=self.step)
        self.in_row, deferred, self.deferred = set(), self.deferred, []
        for r in deferred:
            self.write_eval(r)

    def write_eval(self, record: dict[str, Any]) -> None:
        # W&B's own step only grows, and an evaluation may land after later steps: its curves are
        # drawn against eval/version (define_metric), its values ride in W&B's open row. A row holds
        # one evaluation per set: another one waits for the next row (or close), never overwriting it.
        if not self.eval_axis:
            self.run.define_metric("eval/version")
            self.run.define_metric("eval/*", step_metric="eval/version")
            self.eval_axis = True
        if record["set"] in self.in_row:
            self.deferred.append(record)
            return
        self.in_row.add(record["set"])
        self.run.log({"eval/version": int(record["version"]), **eval_scalars(record)}, commit=False)

    def write_samples(self, rows: list[dict[str, Any]]) -> None:
        self.samples += [[r.get(c) for c in sample_columns()] for r in rows]

    def close(self) -> None:
        import wandb

        for r in self.deferred:   # (evaluations that found their row taken: rows of their own)
            self.step += 1
            self.run.log({"eval/version": int(r["version"]), **eval_scalars(r)}, step=self.step)
        if self.samples:   # what the model wrote, as one table (samples.jsonl has the same rows)
            self.run.log({"samples": wandb.Table(columns=sample_columns(), data=self.samples)})   # (commits the open row)
        self.run.finish()
        wandb.teardown()   # stops W&B's service process now, not at interpreter exit


SINKS = {"tensorboard": TensorBoardSink, "wandb": WandbSink}


def open_sinks(names: list[str], run_dir: str, run_name: str, config: dict[str, Any],
               options: dict[str, dict[str, Any]] | None = None) -> list[Any]:
    """The sinks for these logger names (jsonl is metrics.jsonl itself: no sink); `options`: a sink's
    own settings by name (run.wandb)."""
    sinks = []
    try:
        for n in names:
            if n in SINKS:
                sinks.append(SINKS[n](run_dir, run_name, config, **({"options": options[n]} if (options or {}).get(n) else {})))
    except BaseException:
        close_sinks(sinks)
        raise
    return sinks


def open_for_run(graph: Any, run_dir: str, config: dict[str, Any]) -> list[Any] | None:
    """The sinks a validated graph's `run.loggers` asks for, or None after saying why one could
    not start."""
    from dora.graph.loggers import loggers_of
    try:
        return open_sinks(loggers_of(graph), run_dir, graph.name, config, {"wandb": dict(graph.run.wandb or {})})
    except Exception as e:
        print(f"dora run: a logger in run.loggers could not start: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def write_to(sinks: list[Any], record: Any, method: str = "write") -> None:
    """Hand one record (a step's; `write_eval`: an evaluation's; `write_samples`: sample rows) to every
    sink; a sink that raises is reported and dropped."""
    for s in list(sinks):
        try:
            getattr(s, method)(record)
        except Exception as e:
            step = record.get("step") if isinstance(record, dict) else None
            print(f"dora run: logger {s.name} failed at step {step} and was closed "
                  f"(metrics.jsonl keeps every step): {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            sinks.remove(s)
            close_sinks([s])


def close_sinks(sinks: list[Any]) -> None:
    for s in sinks:
        try:
            s.close()
        except Exception as e:
            print(f"dora run: closing logger {s.name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
