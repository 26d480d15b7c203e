"""A step type from a lab's own package: the cross-connects every switch of the bench holds on its allowed
ports, read back through the driver (nothing is changed), as the step's summary."""
from harness.config import register_step
from harness.specs import Field, Spec
from harness.steps import Check, StepOutcome


class CensusParams(Spec):
    """Read every switch's cross-connects on the ports the inventory allows."""

    switches: list[str] = Field([], description="switch names; empty: every switch of the bench")


@register_step("cross_connect_census", CensusParams)
def cross_connect_census(ctx, step) -> StepOutcome:
    names = step.params["switches"] or list(ctx.bench.inventory.ocs)
    summary, checks = {}, []
    for name in names:
        resource = ctx.bench.inventory.ocs[name]
        patches = {i: e for i, e in ctx.switch(name).patches().items()
                   if i in resource.allowed_ports or e in resource.allowed_ports}
        summary[f"{name}_patches"] = len(patches)
        n, m = resource.size
        inside = all(1 <= i <= n < e <= n + m for i, e in patches.items())
        checks.append(Check(name=f"{name}: every patch joins an ingress to an egress", ok=inside,
                            detail=", ".join(f"{i}->{e}" for i, e in sorted(patches.items()))[:500]))
    return StepOutcome(ok=all(c["ok"] for c in checks), checks=checks, summary=summary)
