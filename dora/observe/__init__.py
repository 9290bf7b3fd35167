"""Looking at runs: metrics.jsonl and summary.json (metrics.py), metric sinks (TensorBoard, W&B),
the trace (trace.py), the progress bar, the dashboard (dashboard/) and plots. It reads run files
and the state a run hands it; it imports nothing of the runtime or the RL layer."""
