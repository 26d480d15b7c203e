"""What `--bench` names: an emulated bench (its kind, timing profile and switch protocols) or an inventory file.
Parsing only: starting the emulator is the runner's (harness.runner.resolve_bench)."""
from __future__ import annotations

from urllib.parse import parse_qs

from devices.ocs.registry import DEFAULT_PROTOCOL, OcsConfigError, get_protocol
from harness.errors import InputError

BENCH_KINDS = ("emulated:PROFILE[?ocs=PROTOCOL]", "emulated-netns:PROFILE[?ocs=PROTOCOL]",
               "emulated-sshd:PROFILE[?ocs=PROTOCOL]", "INVENTORY.yaml")
NETNS_KINDS = ("emulated-netns", "emulated-sshd")  # a real data plane in namespaces (sshd: real hosts in them)


def emulated_spec(spec: str) -> tuple[str, str, str] | None:
    """'emulated[-netns|-sshd]:PROFILE[?ocs=PROTOCOL]' → (kind, profile, protocol); None for an inventory path.
    The protocol is any registered switch protocol (default: the registry's): the same emulated switch, served over
    that protocol's wire, so CI can drive the SCPI or NETCONF driver through `--bench` alone. Several, comma-separated
    (`?ocs=polatis-tl1,polatis-scpi`): as many switches over the one physics (devices.emulated.bench.SwitchSlice),
    returned as "a,b"."""
    kind, _, rest = spec.partition(":")
    if kind not in ("emulated", *NETNS_KINDS) or not rest:
        return None
    profile, _, query = rest.partition("?")
    options = parse_qs(query, keep_blank_values=True, strict_parsing=False) if query else {}
    unknown = set(options) - {"ocs"}
    if unknown or not profile or any(len(v) != 1 for v in options.values()):
        raise InputError(f"--bench: expected {kind}:PROFILE or {kind}:PROFILE?ocs=PROTOCOL", spec)
    try:
        protocol = ",".join(get_protocol(name).name for name in options.get("ocs", [DEFAULT_PROTOCOL])[0].split(","))
    except OcsConfigError as exc:
        raise InputError(f"--bench: {exc}", spec) from None
    return kind, profile, protocol
