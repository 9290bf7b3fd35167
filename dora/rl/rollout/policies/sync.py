"""sync: K=0, RBS=TBS. Dispatch TBS for version v, wait for all of it, train, publish v+1. A held-out
evaluation of v runs between the publish of v and the dispatch of its batch, as verl's does."""

from .batch import BatchPolicy


class SyncPolicy(BatchPolicy):
    name = "sync"
    staleness = 0
    batch_dispatch = True
    listing_order = 0
    colocated = True
    eval_barrier = True
