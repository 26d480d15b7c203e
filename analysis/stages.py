"""The one stage table: every stage's name, order, what on a host marks it, the timing-profile key of the
delay that leads to it, and its label. The event schema (harness.events), the cycle rules
(harness.bench.stages), the statistics (`CHAIN`), the plots and the emulator's profile keys derive from it.

Plain data, so every package may import it (analysis/ imports neither harness/ nor devices/)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str
    label: str
    watch: tuple[str, str] | None = None  # the agent's (watch field, value) that marks it
    profile_key: str | None = None  # timing-profile key of the delay from `after` to this stage
    after: str | None = None  # the stage that precedes it on the same port (chain)
    up: bool = True  # on the path from the command to traffic (False: the side losing light, faults)


STAGE_TABLE: tuple[Stage, ...] = (
    Stage("ocs_command_sent", "OCS command sent"),
    Stage("ocs_command_completed", "OCS switch", profile_key="switch", after="ocs_command_sent"),
    Stage("light_detected", "LOS clear", ("rx_los", "0"), "los_clear", "ocs_command_completed"),
    Stage("cdr_locked", "CDR lock", ("rx_lol", "0"), "cdr_lock", "light_detected"),
    Stage("phy_up", "PHY up", ("carrier", "1"), "phy_up", "cdr_locked"),
    Stage("port_active", "port active", ("state", "ACTIVE"), "port_active", "phy_up"),
    Stage("first_packet", "first packet", None, None, "port_active"),
    Stage("light_lost", "light lost", ("rx_los", "1"), up=False),
    Stage("port_down", "port down", ("carrier", "0"), "link_down", "light_lost", up=False),
    Stage("fault", "fault", up=False),
)
BY_NAME = {s.name: s for s in STAGE_TABLE}
STAGES = tuple(s.name for s in STAGE_TABLE)
STAGES_UP = tuple(s.name for s in STAGE_TABLE if s.up)
STAGES_DOWN = tuple(s.name for s in STAGE_TABLE if not s.up and s.name != "fault")
# The stages a NIC port passes, in order, after the light reaches it: each one's true time is no earlier
# than the one before it (the ordering every bound in harness.bench.stages relies on).
PORT_CHAIN = ("light_detected", "cdr_locked", "phy_up", "port_active", "first_packet")
WATCH_STAGES = {s.watch: s.name for s in STAGE_TABLE if s.watch}
# Per-port chain durations: profile-style name -> (later stage, earlier stage).
CHAIN = {(s.profile_key or s.name): (s.name, s.after) for s in STAGE_TABLE
         if s.after and s.name not in ("ocs_command_completed",)}
NIC_PROFILE_KEYS = tuple(s.profile_key for s in STAGE_TABLE if s.profile_key and s.name in PORT_CHAIN + STAGES_DOWN)
