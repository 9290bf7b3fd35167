"""dora: asynchronous RL post-training of language models as graphs of operators."""

__version__ = "0.1.0"
