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
    # Only where the NIC shows it (a CMIS module's states in `ethtool -m`): outside PORT_CHAIN and the profile's
    # required keys, so a port or profile without it is measured and emulated exactly as before.
    optional: bool = False


STAGE_TABLE: tuple[Stage, ...] = (
    Stage("ocs_command_sent", "OCS command sent"),
    Stage("ocs_command_completed", "OCS switch", profile_key="switch", after="ocs_command_sent"),
    Stage("light_detected", "LOS clear", ("rx_los", "0"), "los_clear", "ocs_command_completed"),
    Stage("cdr_locked", "CDR lock", ("rx_lol", "0"), "cdr_lock", "light_detected"),
    # CMIS module and data-path state machines (CMIS 5 §6.3.2, ethtool cmis.c "Module State : 0x03 (ModuleReady)"):
    # a host that re-initialises the module on link loss passes them again before the PHY can train.
    Stage("module_ready", "module ready (CMIS)", ("module_state", "ModuleReady"), "module_ready", "cdr_locked",
          optional=True),
    Stage("datapath_activated", "data path activated (CMIS)", ("datapath_state", "DataPathActivated"),
          "datapath_activated", "module_ready", optional=True),
    Stage("phy_up", "PHY up", ("carrier", "1"), "phy_up", "cdr_locked"),
    Stage("port_active", "port active", ("state", "ACTIVE"), "port_active", "phy_up"),
    Stage("first_packet", "first packet", None, None, "port_active"),
    Stage("light_lost", "light lost", ("rx_los", "1"), up=False),
    Stage("port_down", "port down", ("carrier", "0"), "link_down", "light_lost", up=False),
    Stage("fault", "fault", up=False),
)
BY_NAME = {s.name: s for s in STAGE_TABLE}
STAGES = tuple(s.name for s in STAGE_TABLE)
STAGES_UP = tuple(s.name for s in STAGE_TABLE if s.up and not s.optional)
STAGES_DOWN = tuple(s.name for s in STAGE_TABLE if not s.up and s.name != "fault")
# The stages a NIC port passes, in order, after the light reaches it: each one's true time is no earlier
# than the one before it (the ordering every bound in harness.bench.stages relies on).
PORT_CHAIN = ("light_detected", "cdr_locked", "phy_up", "port_active", "first_packet")
# The same with the optional stages a port may show, in table order (a CMIS port: light, lock, module, data path,
# PHY, active, first packet).
OPTIONAL_STAGES = tuple(s.name for s in STAGE_TABLE if s.optional)
FULL_PORT_CHAIN = tuple(s.name for s in STAGE_TABLE if s.name in PORT_CHAIN or s.optional)
WATCH_STAGES = {s.watch: s.name for s in STAGE_TABLE if s.watch}
# Per-port chain durations: profile-style name -> (later stage, earlier stage).
CHAIN = {(s.profile_key or s.name): (s.name, s.after) for s in STAGE_TABLE
         if s.after and s.name not in ("ocs_command_completed",) and not s.optional}
NIC_PROFILE_KEYS = tuple(s.profile_key for s in STAGE_TABLE if s.profile_key and s.name in PORT_CHAIN + STAGES_DOWN)
# Profile keys of the delays on the path from the command to traffic: the ones that time the stamps a
# reconfiguration's delay is measured between (the side losing light, `dark` and `link_down`, is not among them).
UP_PROFILE_KEYS = tuple(s.profile_key for s in STAGE_TABLE if s.up and s.profile_key)
# Profile keys of the optional stages: absent (the default), the emulated port has no such states.
OPTIONAL_NIC_PROFILE_KEYS = tuple(s.profile_key for s in STAGE_TABLE if s.optional and s.profile_key)
