"""sync: K=0, RBS=TBS. Dispatch TBS for version v, wait for all of it, train, publish v+1."""

from .batch import BatchPolicy


class SyncPolicy(BatchPolicy):
    name = "sync"
    staleness = 0
    batch_dispatch = True
    listing_order = 0
    colocated = True
