"""Reconfiguration patterns: which NIC port's transmitter feeds which port's receiver in each cycle.

A pattern yields, per cycle, a directed map `source port -> destination port` over NIC port keys
("host:netdev"). Pairings are symmetric (a↔b); a permutation need not be.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from harness.errors import InputError

PATTERNS = ("ring-shift", "random-matching", "permutation", "schedule")


def round_robin(ports: list[str], round_index: int) -> dict[str, str]:
    """Round `round_index` of the circle method: k ports (k even) give k−1 perfect matchings that together
    use every pair once, and consecutive rounds share no pair — every port changes peer every cycle."""
    k = len(ports)
    r = round_index % (k - 1)
    ring = ports[1:]
    ring = ring[r:] + ring[:r]
    order = [ports[0]] + ring
    pairs = {}
    for i in range(k // 2):
        a, b = order[i], order[k - 1 - i]
        pairs[a], pairs[b] = b, a
    return pairs


def random_matching(ports: list[str], rng: np.random.Generator) -> dict[str, str]:
    order = [ports[i] for i in rng.permutation(len(ports))]
    pairs = {}
    for a, b in zip(order[::2], order[1::2]):
        pairs[a], pairs[b] = b, a
    return pairs


def random_derangement(ports: list[str], rng: np.random.Generator) -> dict[str, str]:
    while True:
        perm = rng.permutation(len(ports))
        if not np.any(perm == np.arange(len(ports))):
            return {ports[i]: ports[j] for i, j in enumerate(perm)}


def load_schedule(path: str, ports: list[str]) -> list[dict[str, str]]:
    """A YAML mapping `cycles: [...]`, each cycle a list of [source, destination] port-key pairs (directed), or
    of `a <-> b` strings for symmetric pairs. (A mapping, like every YAML file the harness reads: `include:` and
    `${ENV}` templating work here too.)"""
    from harness.config import load_yaml

    loaded = load_yaml(path)
    if "cycles" not in loaded.data:
        raise InputError("schedule: expected a mapping with 'cycles: [[[SRC, DST], ...], ...]'", path,
                         loaded.data.where()[1] if hasattr(loaded.data, "where") else None)
    cycles = loaded.data["cycles"]
    if not isinstance(cycles, list) or not cycles:
        raise InputError("schedule: expected a non-empty list of cycles", path, getattr(cycles, "line", None))
    known = set(ports)
    out = []
    for c, cycle in enumerate(cycles):
        line = cycles.where(c)[1] if hasattr(cycles, "where") else None
        if not isinstance(cycle, list):
            raise InputError(f"schedule cycle {c + 1}: expected a list of pairs", path, line)
        mapping: dict[str, str] = {}
        for item in cycle:
            if isinstance(item, str) and "<->" in item:
                a, b = (s.strip() for s in item.split("<->"))
                pairs = [(a, b), (b, a)]
            elif isinstance(item, list) and len(item) == 2 and all(isinstance(s, str) for s in item):
                pairs = [tuple(item)]
            else:
                raise InputError(f"schedule cycle {c + 1}: expected [SRC, DST] or 'A <-> B', found {item!r}",
                                 path, line)
            for src, dst in pairs:
                for p in (src, dst):
                    if p not in known:
                        raise InputError(f"schedule cycle {c + 1}: unknown port {p!r} (known: "
                                         f"{', '.join(sorted(known))})", path, line)
                if src in mapping or dst in mapping.values():
                    raise InputError(f"schedule cycle {c + 1}: port used twice ({src} -> {dst})", path, line)
                mapping[src] = dst
        out.append(mapping)
    return out


def cycle_mappings(pattern: str, ports: list[str], cycles: int, rng: np.random.Generator,
                   schedule: str = "") -> Iterator[tuple[int, dict[str, str]]]:
    """(cycle, mapping) for cycles 0..cycles. Cycle 0 is the state the bench starts from; a resumed run
    draws the same stream and skips what it already measured."""
    if pattern not in PATTERNS:
        raise InputError(f"pattern: expected one of {', '.join(PATTERNS)}, found {pattern!r}")
    if pattern != "schedule" and (len(ports) < 2 or (pattern != "permutation" and len(ports) % 2)):
        raise InputError(f"pattern {pattern}: needs an even number (>= 2) of ports, found {len(ports)}")
    plan = load_schedule(schedule, ports) if pattern == "schedule" else None
    for cycle in range(cycles + 1):
        if pattern == "ring-shift":
            yield cycle, round_robin(ports, cycle)
        elif pattern == "random-matching":
            yield cycle, random_matching(ports, rng)
        elif pattern == "permutation":
            yield cycle, random_derangement(ports, rng)
        else:
            yield cycle, plan[cycle % len(plan)]


def ocs_mapping(mapping: dict[str, str], tx: dict[str, int], rx: dict[str, int]) -> dict[int, int]:
    """NIC-level map source -> destination as OCS cross-connects ingress -> egress."""
    return {tx[src]: rx[dst] for src, dst in mapping.items()}


def sources(mapping: dict[str, str]) -> dict[str, str]:
    """destination -> source: which port lights each receiver."""
    return {dst: src for src, dst in mapping.items()}
