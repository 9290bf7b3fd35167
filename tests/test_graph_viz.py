"""Drawings contain every node and edge, SVG is well-formed, HTML is self-contained."""

from __future__ import annotations

import glob
import os
import re
import shutil
import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from dora.graph import viz
from dora.graph.model import Graph
from dora.graph.yaml_io import load_graph, load_text
from test_graph_helpers import BASE, graphs, valid_graphs

PIPELINES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "pipelines", "*.yaml")))
SVG_NS = "{http://www.w3.org/2000/svg}"


def check_drawings(g: Graph) -> None:
    dot, mmd, svg, html = viz.to_dot(g), viz.to_mermaid(g), viz.to_svg(g, "python"), viz.to_html(g)
    root = ET.fromstring(svg)                       # well-formed
    nodes = {el.get("data-node") for el in root.iter(f"{SVG_NS}g") if el.get("class") == "node"}
    edges = {(el.get("data-src"), el.get("data-dst")) for el in root.iter(f"{SVG_NS}g") if el.get("class") == "edge"}
    weights = {(el.get("data-src"), el.get("data-dst")) for el in root.iter(f"{SVG_NS}g") if el.get("class") == "weights"}
    assert nodes == set(g.nodes)
    assert edges == {(e.src, e.dst) for e in g.edges}
    assert weights == {(w.src, w.dst) for w in g.weights}
    for n in g.nodes:
        assert f'"{n}" [label=' in dot and f"n_{n}[" in mmd and f'data-node="{n}"' in html
    for e in g.edges:
        assert f'"{e.src}" -> "{e.dst}" [label=' in dot
        assert re.search(rf"n_{e.src} -->(\|[^|]*\|)? n_{e.dst}\b", mmd)
    for w in g.weights:
        assert f'"{w.src}" -> "{w.dst}" [style=dashed' in dot and f"n_{w.src} -.->" in mmd
    assert svg.strip() in html


@pytest.mark.parametrize("path", PIPELINES, ids=os.path.basename)
def test_pipelines_draw_completely(path):
    check_drawings(load_graph(path))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(valid_graphs())
def test_random_graphs_draw_completely(g):
    check_drawings(g)


def test_edges_are_labelled_with_columns_and_weights_dashed():
    g = load_graph(PIPELINES[[os.path.basename(p) for p in PIPELINES].index("quickstart.yaml")])
    svg = viz.to_svg(g, "python")
    assert "+ response_ids, response_text" in svg and "[group by group_id]" in svg and "+ advantages" in svg
    assert 'class="weights"' in svg and "stroke-dasharray" in svg
    assert "pool rollout \u00b7 cpu \u00d7 2" in svg and "generate \u00d72" in svg
    tip = re.search(r'<g class="node" id="node-rollout".*?<title>(.*?)</title>', svg, re.S).group(1)
    assert "max_tokens = 128" in tip


def test_html_is_self_contained():
    html = viz.to_html(load_graph(PIPELINES[0]))
    urls = re.findall(r"https?://[^\s\"')]+", html)
    assert set(urls) <= {"http://www.w3.org/2000/svg"}, urls
    assert "<link" not in html and not re.search(r"\ssrc=", html) and "@import" not in html
    assert "<script>" in html and "<style>" in html and "dora-data" in html


def test_invalid_graph_still_draws():
    g, _ = load_text(BASE.replace("{prompts: prompts/out}", "{prompts: train/out}").replace("op: reward", "op: nosuch"))
    check_drawings(g)


def test_write_picks_format_from_extension(tmp_path):
    g = load_graph(PIPELINES[0])
    for ext in viz.FORMATS:
        assert viz.write(g, str(tmp_path / f"g.{ext}")) == ext
    assert (tmp_path / "g.mmd").read_text().startswith("flowchart LR")
    with pytest.raises(ValueError, match="unknown drawing format"):
        viz.render(g, "png")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot is not installed")
def test_graphviz_svg():
    g = load_graph(PIPELINES[0])
    svg = viz.to_svg(g, "dot")
    ET.fromstring(svg)
    for n in g.nodes:
        assert n in svg


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(graphs())
def test_arbitrary_graphs_draw_completely(g):
    check_drawings(g)     # fan-out, odd weights edges, unknown columns: drawing never fails
