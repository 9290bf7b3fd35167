"""Sharded ops: a node's replicas as the ranks of one torch.distributed group (FSDP2).

rank_group.py   the group: rendezvous at rank 0, commands from rank 0 to the others, bytes and reductions
token_split.py  a batch's rows split across ranks by tokens, micro-batch counts aligned
fsdp_model.py   a model sharded with fully_shard (or plain on one rank): precision, activation
                checkpointing, gathered full weights, clipping, sharded checkpoints (torch.distributed.checkpoint)
"""
