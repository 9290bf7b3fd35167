"""one_step_off: K=1, RBS=TBS. Batch t+1 is generated (with v_t) while step t trains."""

from .batch import BatchPolicy


class OneStepOffPolicy(BatchPolicy):
    name = "one_step_off"
    staleness = 1
    batch_dispatch = True
    listing_order = 1
