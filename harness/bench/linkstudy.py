"""What the link studies (`link_failures`, `link_flaps`) and the verdict on them (`spectrumx_verdict`) share:
where their delays come from, and the independent unit of their phase times."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import linkfail as lf
from harness.provenance import evidence_words


def link_provenance(live) -> dict:
    """The run's provenance (LiveBench.provenance) with its words, the packet fabric's detection delay and
    where the data plane's numbers come from."""
    prov = live.provenance()
    prov["words"] = evidence_words(prov)
    if live.truth:
        prof = live.truth.profile
        prov["detection"] = {"ms": prof.fabric_detection.mean_s * 1e3, "source": prof.fabric_source}
        prov["data_plane"] = ("emulated: the hosts' alltoall_perf times and RDMA counters from the emulator's "
                              "data-plane model (circuits, packet fabric, multiplane stall and re-spread after the "
                              "detection delay), integrated over the ports' state changes at their due times")
    else:
        prov["detection"] = {"ms": None, "source": "the real fabric's own (not modelled)"}
        prov["data_plane"] = f"measured by the transfer tool on bench {prov['bench']}"
    return prov


def iteration_units(g: pd.DataFrame) -> np.ndarray:
    """One time per independent unit, its phases summed: the `unit` column where the study names it (a round:
    one draw of failed fabric links), else an iteration of the trace, rounds apart."""
    keys = (g["unit"].astype(str) if "unit" in g else
            g["round"].astype(str) + "/" + g["iteration"].astype(str))
    return lf.iteration_times(g["measured_s"].to_numpy(dtype=float), keys.to_numpy())
