"""Executing a graph: channels, workers, placement, backends, versions, orchestrator, metrics."""
