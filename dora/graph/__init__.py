"""The model of a pipeline: nodes, ports, edges, pools; builder; YAML; validation; viz."""
