"""Traces: canonical schemas, importers, seeded generators and timed replay (see docs/traces.md)."""
from __future__ import annotations

from traces.errors import TraceFormatError
from traces.generate import diloco_sync_windows, generate_moe, mmpp_arrivals, poisson_arrivals
from traces.moe import MoePhase, load_moe, moe_phases
from traces.requests import load_requests, load_sync_windows
from traces.schema import MOE_PHASES, MoeHeader, MoeTrace, write_moe, write_requests, write_sync_windows

__all__ = ["TraceFormatError", "MoeHeader", "MoeTrace", "MoePhase", "MOE_PHASES", "load_requests", "load_moe",
           "load_sync_windows", "moe_phases", "generate_moe", "poisson_arrivals", "mmpp_arrivals",
           "diloco_sync_windows", "write_moe", "write_requests", "write_sync_windows"]
