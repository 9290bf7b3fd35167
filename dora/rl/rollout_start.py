"""The RL driver's rollout controller, started once the first prompts and the trainer's starting
weights are there (and again after a trainer restart, dora/rl/trainer_restart.py): the generate
replicas as RolloutInstances (the same objects across restarts: they know what each replica holds),
the finished trajectories a checkpoint put back, async.elastic's spares and the replicas that share
the trainer's devices."""

from __future__ import annotations

from dora.rl.elastic_lending import ElasticLending
from dora.rl.replica_instance import ReplicaInstance
from dora.rl.rollout import RolloutController
from dora.rl.shared_devices import shared_devices


def start_rollout(d) -> RolloutController:
    """RLDriver `d`'s rollout controller, started (version d.initial_version loaded, first dispatch)."""
    gen = d.graph.nodes[d.roles.generate]
    slots = d.params[d.roles.generate]["max_batch"]
    hosts = d.cfg.versions_per_instance   # the run's M (resolve makes it 1 where an engine hosts one version)
    instances = d.reused_instances or [ReplicaInstance(d, gen.name, r, slots, hosts) for r in range(gen.replicas)]
    rc = RolloutController(d.cfg, instances, d.prompts.take, d.clock, trace=d.trace, initial_version=d.initial_version)
    rc.restore_finished(d.restored_finished)
    d.rc = rc   # (before start: the events its calls deliver find it)
    d.evaluations.rollout_started()   # (before the first dispatch: sync evaluates version 0 first)
    rc.start()
    spares = [r.replica for r in d.ctrl.plan.of(gen.name) if r.spare]
    if spares:
        d.elastic = ElasticLending(d, [ReplicaInstance(d, gen.name, r, slots, hosts) for r in spares])
    d.shared = shared_devices(d, instances)
    return rc
