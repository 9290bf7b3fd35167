"""The `dora` command: validate, draw and list pipelines; dispatch run, simulate, dashboard, plot and eval.

Exit codes: 0 ok, 1 failure, 2 bad input (config, graph, arguments). Bad input never
ends in a traceback: it is reported as `file:line: error: ...` lines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Sequence

import dora

EXAMPLES = """\
examples:
  dora validate pipelines/quickstart.yaml
  dora validate pipelines/quickstart.yaml nodes.rollout.replicas=4 async.mode=dora
  dora viz pipelines/grpo.yaml -o grpo.html          # also .svg, .dot, .mmd
  dora ops                                           # every op: ports, columns, params
  dora run pipelines/quickstart.yaml --out runs/quickstart [--dashboard]
  dora dashboard runs/quickstart                     # the run's page again, on 127.0.0.1
  dora plot runs/a runs/b -o compare.png             # reward, tokens/s, staleness, versions live
  dora eval runs/quickstart/checkpoints/step_40      # held-out sets, no training (or a pipeline's base model)
  dora simulate --help
"""

# subcommands implemented elsewhere, imported only when used: name -> (module, function)
DISPATCH = {
    "run": ("dora.rl.launch", "run_main"),
    "simulate": ("dora.sim.simulate_cli", "simulate_main"),
    "dashboard": ("dora.observe.dashboard.read_run", "dashboard_main"),
    "plot": ("dora.observe.plot_runs", "plot_main"),
    "eval": ("dora.rl.eval_cli", "eval_main"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dora",
        description="Asynchronous RL post-training of language models as graphs of operators.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"dora {dora.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    v = sub.add_parser("validate", help="check a pipeline file and report every problem", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("pipeline", help="pipeline YAML file")
    v.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. nodes.rollout.replicas=4")
    v.add_argument("--data", action="store_true", help="read every row of each file source as the run will (parsed, "
                   "tokenized, held to the prompt limit) and name every bad row as file:N (default: the first "
                   "100 rows)")
    z = sub.add_parser("viz", help="draw a pipeline (html, svg, dot, mmd)", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    z.add_argument("pipeline", help="pipeline YAML file")
    z.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. nodes.rollout.replicas=4")
    z.add_argument("-o", "--output", help="output file; its extension picks the format (.html .svg .dot .mmd)")
    z.add_argument("--format", choices=("html", "svg", "dot", "mmd"), help="format (default: from -o, else mmd to stdout)")
    z.add_argument("--engine", choices=("auto", "dot", "python"), default="auto", help="SVG layout: Graphviz dot if installed (auto) or pure Python")
    z.add_argument("--force", action="store_true", help="draw even if the pipeline has validation errors")
    o = sub.add_parser("ops", help="list the built-in operators: ports, columns, params")
    o.add_argument("--json", action="store_true", help="machine-readable output")
    o.add_argument("--markdown", action="store_true", help="the reference as markdown (docs/reference.md is this)")
    for name in DISPATCH:
        sub.add_parser(name, help=f"see `dora {name} --help`", add_help=False)
    p.commands = {"validate": v, "viz": z}   # (their options may come after the overrides: parsed intermixed)
    return p


def _report(diags: list, stream=None) -> None:
    stream = stream or sys.stderr
    for d in diags:
        print(d.format(), file=stream)


def cmd_validate(args: argparse.Namespace) -> int:
    import contextlib

    from dora.graph.diagnostics import errors_of
    from dora.graph.prompt_limits import every_row
    from dora.graph.validate import check_file

    progress = DataProgress(sys.stderr)
    with every_row(progress) if args.data else contextlib.nullcontext({}) as counts:
        g, diags = check_file(args.pipeline, args.overrides)
    progress.done()
    _report(diags)
    errs = errors_of(diags)
    rows = "".join(f"; {f}: {n:,} rows read" for f, n in counts.items())
    if g is None or errs:
        print(f"{args.pipeline}: {len(errs)} error(s), {len(diags) - len(errs)} warning(s){rows}", file=sys.stderr)
        return 2
    print(f"ok: pipeline {g.name!r} in {args.pipeline}: {len(g.nodes)} nodes, {len(g.edges)} data edges, "
          f"{len(g.weights)} weights edges, async {g.async_.mode}" + (f"; {len(diags)} warning(s)" if diags else "")
          + rows)
    return 0


class DataProgress:
    """`dora validate --data` on a large file: a line on stderr each second (rewritten in place on a
    terminal) saying how far the read is, from the first second on."""

    def __init__(self, stream, every_s: float = 1.0):
        import time
        self.stream, self.every_s, self.clock = stream, every_s, time.monotonic
        self.start = self.last = self.clock()
        self.open_line = False   # a terminal line rewritten in place, not ended yet

    def __call__(self, file: str, rows: int, fraction: float | None) -> None:
        now = self.clock()
        if now - self.last < self.every_s:
            return
        self.last = now
        part = f" ({fraction:.0%})" if fraction is not None else ""
        tty = self.stream.isatty()
        start, end = ("\r", "") if tty else ("", "\n")
        print(f"{start}reading {file}: {rows:,} rows{part}, {now - self.start:.0f} s", end=end, file=self.stream,
              flush=True)
        self.open_line = tty

    def done(self) -> None:
        if self.open_line:
            print(file=self.stream)


def cmd_viz(args: argparse.Namespace) -> int:
    from dora.graph import viz
    from dora.graph.diagnostics import errors_of
    from dora.graph.validate import check_file

    fmt = args.format or (viz.format_of(args.output) if args.output else "mmd")
    if fmt not in viz.FORMATS:
        print(f"dora viz: cannot tell the format of {args.output!r}; use an extension in {viz.FORMATS} or --format", file=sys.stderr)
        return 2
    g, diags = check_file(args.pipeline, args.overrides)
    _report(diags)
    if g is None or (errors_of(diags) and not args.force):
        print(f"{args.pipeline}: not drawn: fix the errors above (or pass --force)", file=sys.stderr)
        return 2
    try:
        text = viz.render(g, fmt, args.engine)
    except RuntimeError as e:     # --engine dot without Graphviz
        print(f"dora viz: {e}", file=sys.stderr)
        return 1
    if not args.output:
        sys.stdout.write(text)
        return 0
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"dora viz: cannot write {args.output}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} ({fmt}, {len(g.nodes)} nodes)")
    return 0


def _param_line(ps) -> str:
    bounds = f" {{{', '.join(map(str, ps.choices))}}}" if ps.choices else ""
    bounds += f" [{ps.range_text}]" if ps.range_text else ""
    bounds += f" (names from {ps.names_from})" if ps.names_from else ""
    return f"{ps.name}: {ps.type} = {json.dumps(ps.default)}{bounds}  - {ps.doc}"


def cmd_ops(args: argparse.Namespace) -> int:
    from dora.graph.model import AsyncConfig, EvalSet, RunConfig
    from dora.graph.op_registry import builtin_ops
    from dora.graph.sections import section_specs

    from dora.graph.opspec import import_object

    ops = builtin_ops()
    # the model section's keys are declared beside the model code (named by string: cli sits above ops)
    sections = {"model": import_object("dora.ops.model_section:MODEL_KEYS"), "async": section_specs(AsyncConfig),
                "run": section_specs(RunConfig), "eval": section_specs(EvalSet)}
    # generate's `tools` entries (named by string, as the OpSpecs name their checks: cli sits above ops)
    tools = {kind: import_object(path).settings for kind, path in import_object("dora.ops.tools.tool_registry:KINDS").items()}
    reward_fns = {"code_exec": import_object("dora.ops.tools.code_exec:SETTINGS")}   # reward fns with declared params
    if args.json:
        # one list: the ops, the pipeline sections ("section": true), the tool kinds ("tool": true), the reward
        # fns with declared params ("reward_fn": true)
        print(json.dumps([s.describe() for s in ops.values()]
                         + [{"name": k, "section": True, "params": [p.describe() for p in v.values()]}
                            for k, v in sections.items()]
                         + [{"name": k, "tool": True, "params": [p.describe() for p in v.values()]}
                            for k, v in tools.items()]
                         + [{"name": k, "reward_fn": True, "params": [p.describe() for p in v.values()]}
                            for k, v in reward_fns.items()], indent=2, default=str))
        return 0
    if args.markdown:
        print(ops_markdown(ops, sections, tools, reward_fns), end="")
        return 0
    for s in ops.values():
        print(f"{s.name}: {s.doc}")
        print(f"  impl     {s.impl}")
        for p in s.inputs:
            print(f"  input    {p.name} needs {', '.join(p.needs) or '-'}")
        if not s.inputs:
            print("  input    - (source)")
        print(f"  output   out adds {', '.join(s.adds) or '-'}" + ("  (+ weights edge to generate)" if s.is_update else ""))
        for w in s.when:
            cond = f"{w.param} {'not in' if w.negate else 'in'} {list(w.values)}"
            parts = ([f"needs {', '.join(w.needs)}"] if w.needs else []) + ([f"adds {', '.join(w.adds)}"] if w.adds else [])
            print(f"  when     {cond}: {'; '.join(parts)}")
        if s.columns:
            print(f"  columns  {s.columns_doc}")
        for ps in s.params.values():
            print(f"  param    {_param_line(ps)}")
        if s.check:
            print(f"  check    {s.check}")
        print()
    for name, specs in sections.items():
        extra = {"model": " a tiny random model's keys, or path: DIR, or name: NAME",
                 "eval": " one mapping per held-out set: eval: {NAME: {...}}"}.get(name, "")
        print(f"{name}: (pipeline section)" + extra)
        for ps in specs.values():
            print(f"  setting  {_param_line(ps)}")
        print()
    for kind, specs in tools.items():
        print(f"tool {kind}: (generate param tools: {{name: NAME, kind: {kind}, <settings>}})")
        for ps in specs.values():
            print(f"  setting  {_param_line(ps)}")
        print()
    for fn, specs in reward_fns.items():
        print(f"reward fn {fn}: (reward params: {{fn: {fn}, params: {{<settings>}}}})")
        for ps in specs.values():
            print(f"  setting  {_param_line(ps)}")
        print()
    return 0


def _md_rows(specs) -> list[str]:
    rows = ["| key | type | default | allowed | what it does |", "|---|---|---|---|---|"]
    for ps in specs.values():
        allowed = ", ".join(map(str, ps.choices)) if ps.choices else ps.range_text or (
            f"names from `{ps.names_from}`" if ps.names_from else "")
        rows.append(f"| `{ps.name}` | {ps.type} | `{json.dumps(ps.default)}` | {allowed} | {ps.doc.replace('|', '/')} |")
    return rows


def ops_markdown(ops, sections, tools, reward_fns) -> str:
    """`dora ops --markdown`: docs/reference.md, from the declarations (tests/test_cli.py keeps it current)."""
    out = ["# Reference: pipeline sections, ops and tools", "",
           "Generated from the declarations by `dora ops --markdown > docs/reference.md`; do not edit by hand.", "",
           "## Pipeline sections", ""]
    for name, specs in sections.items():
        out += [f"### `{name}:`", "", *_md_rows(specs), ""]
    out += ["## Ops", ""]
    for s in ops.values():
        ports = "; ".join(f"input `{p.name}` needs {', '.join(p.needs) or '-'}" for p in s.inputs) or "a source (no input)"
        out += [f"### `{s.name}`", "", f"{s.doc}. {ports}; output `out` adds {', '.join(s.adds) or '-'}.", ""]
        out += [f"- when `{w.param}` {'not in' if w.negate else 'in'} {list(w.values)}: "
                + "; ".join(([f"needs {', '.join(w.needs)}"] if w.needs else []) + ([f"adds {', '.join(w.adds)}"] if w.adds else []))
                for w in s.when]
        out += ([""] if s.when else []) + [*_md_rows(s.params), ""]
    out += ["## Tools (generate's `tools: [{name, kind, <settings>}]`)", ""]
    for kind, specs in tools.items():
        out += [f"### `{kind}`", "", *_md_rows(specs), ""]
    out += ["## Reward functions with settings (reward's `fn: NAME, params: {<settings>}`)", ""]
    for fn, specs in reward_fns.items():
        out += [f"### `{fn}`", "", *_md_rows(specs), ""]
    return "\n".join(out)


def _dispatch(name: str, rest: list[str]) -> int:
    module, func = DISPATCH[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            print(f"dora {name}: not available in this installation ({module} is missing)", file=sys.stderr)
            return 1
        raise
    fn = getattr(mod, func, None)
    if fn is None:
        print(f"dora {name}: {module} has no {func}()", file=sys.stderr)
        return 1
    return int(fn(rest) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DISPATCH:
        return _dispatch(argv[0], argv[1:])
    parser = _parser()
    try:
        if argv and argv[0] in parser.commands:   # `dora validate P k=v --data k=v`: options anywhere
            args = parser.commands[argv[0]].parse_intermixed_args(argv[1:])
            args.command = argv[0]
        else:
            args = parser.parse_args(argv)
    except SystemExit as e:            # argparse: --help/--version (0) or bad arguments (2)
        return int(e.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    from dora.graph.diagnostics import GraphError

    try:
        return {"validate": cmd_validate, "viz": cmd_viz, "ops": cmd_ops}[args.command](args)
    except GraphError as e:
        _report(e.diagnostics)
        return 2


if __name__ == "__main__":
    sys.exit(main())
