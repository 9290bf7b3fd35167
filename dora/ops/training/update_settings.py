"""The update op's params as the loss and the off-policy correction take them, and the rules across
them that `dora validate` runs (OpSpec.check of the update op)."""

from __future__ import annotations

from typing import Any

from dora.algos import losses, off_policy


def loss_params(p: dict[str, Any]) -> dict[str, Any]:
    """The update params that go to the policy loss function itself."""
    out = {"clip_eps": p["clip_eps"], "clip_eps_high": p["clip_eps_high"]}
    if p["dual_clip"] is not None:
        out["dual_clip"] = p["dual_clip"]
    return out


def off_policy_of(spec: Any) -> tuple[str, dict[str, Any]]:
    """(name, params) of the `off_policy` param {name: ..., <that correction's params>}; ValueError
    naming what is wrong: the name, a param the correction does not take, a value its rules refuse
    (checked without tensors: dora validate runs this and imports no torch)."""
    names = ", ".join(off_policy.OFF_POLICY.names())
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"off_policy must be a mapping {{name: <{names}>, <its params>}}, got {spec!r}")
    name, params = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    try:
        off_policy.OFF_POLICY.check_params(name, params)
    except (ValueError, TypeError) as e:
        raise ValueError(f"off_policy: {str(e).strip(chr(39))}") from None
    return name, params


def check_params(p: dict[str, Any]) -> list[tuple[str, str]]:
    """Rules across update's params (dora validate runs them; see OpSpec.check)."""
    try:
        off_policy_of(p["off_policy"])
    except ValueError as e:
        return [("off_policy", str(e))]
    try:
        losses.LOSSES.check_params(p["loss"], loss_params(p))
    except ValueError as e:
        return [("dual_clip" if p["dual_clip"] is not None else "loss", str(e))]
    fixed = getattr(losses.LOSSES.get(p["loss"]), "fixed_agg", None)
    if fixed is not None and p["agg"] != fixed:
        return [("agg", f"loss {p['loss']!r} aggregates by {fixed}, got agg {p['agg']!r} (use ppo_clip for other aggregations)")]
    return []
