"""PNG plots for run reports (matplotlib, no display)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.stages import STAGE_TABLE  # noqa: E402

STAGE_STEPS = [(s.label, s.name, s.after) for s in STAGE_TABLE if s.up and s.after and not s.optional]


def plot_iteration_vs_delay(series: list[dict], markers: dict, path: Path, calibrated: set[str] | None = None) -> Path:
    """MixNet iteration time / fat-tree vs a constant reconfiguration delay, 0.1 ms–10 s on log axes (the measured
    NIC re-activation on scale): one line per scenario that moves circuits (dashed: its model carries no verdict
    on the scorecard), the claim's bound
    (e.g. the 5 % threshold), each scenario's break-even d* and the paper's 25 ms and measured delays, all
    named in the legend."""
    fig, ax = plt.subplots(figsize=(12, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    static = sorted({s["scenario"].split("@")[0] for s in series if not s["moves_circuits"]})
    moving = [s for s in series if s["moves_circuits"]]
    lo, hi = (min(s["delay_ms"][0] for s in series), max(s["delay_ms"][-1] for s in series)) if series else (0.1, 100)
    top = 1.2
    for i, s in enumerate(moving):
        color = colors[i % len(colors)]
        ok = calibrated is None or s["scenario"] in calibrated
        ax.plot(s["delay_ms"], s["ratio"], color=color, ls="-" if ok else "--", lw=1.8 if ok else 1.0,
                label=s["scenario"] + ("" if ok else " (model not scored: no verdict)"))
        top = max(top, min(1000.0, max(s["ratio"])))
        if s["break_even_ms"] is not None and lo <= s["break_even_ms"] <= hi:
            ax.axvline(s["break_even_ms"], color=color, ls=":", lw=1.2,
                       label=f"break-even d* {s['scenario']} = {s['break_even_ms']:.1f} ms")
        elif s["break_even_ms"] is not None:
            ax.plot([], [], " ", label=f"break-even d* {s['scenario']} = {s['break_even_ms']:.1f} ms (off scale)")
    bound = next((s["bound"] for s in series if s.get("bound")), None)
    if bound:
        ax.axhline(bound, color="black", lw=1.2, ls="--",
                   label=f"{(bound - 1) * 100:g} % threshold (T_mix = {bound:g} T_ft)")
    style = {"paper_ms": ("tab:green", "paper's 25 ms"), "ocs_mean_ms": ("tab:orange", "measured OCS (cycle mean)"),
             "total_mean_ms": ("tab:red", "measured total (cycle mean)")}
    for key, (color, label) in style.items():
        v = markers.get(key)
        if v is None:
            continue
        if lo <= v <= hi:
            ax.axvline(v, color=color, ls="-.", lw=1, label=f"{label} = {v:.3g} ms")
        else:
            ax.plot([], [], " ", label=f"{label} = {v:.4g} ms (off scale)")
    if static:
        ax.plot([], [], " ", label=f"flat at T_mix(0), never move a circuit: {', '.join(static)}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0.97, top)
    ax.set_xlabel("constant delay per reconfiguration (ms, log)")
    ax.set_ylabel("MixNet iteration time / fat-tree (log)")
    ax.set_title("Where the iteration-time verdict flips", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_stage_breakdown(events: pd.DataFrame, path: Path) -> Path:
    """Box plot of each turnaround stage's duration per port (log scale)."""
    from analysis.stats import port_stage_times

    ports = port_stage_times(events)
    ocs = events[events["stage"].isin(["ocs_command_sent", "ocs_command_completed"])]
    cyc = ocs.pivot_table(index="cycle", columns="stage", values="t_ns", aggfunc="first")
    cycle_of = ports.index.get_level_values("cycle")
    absolute = ports.copy()
    for col in ("ocs_command_sent", "ocs_command_completed"):
        absolute[col] = cyc[col].reindex(cycle_of).to_numpy() if col in cyc else float("nan")
    data, names = [], []
    for name, later, earlier in STAGE_STEPS:
        ms = ((absolute[later] - absolute[earlier]) / 1e6).dropna()
        ms = ms[ms > 0]
        if len(ms):
            data.append(ms.to_numpy())
            names.append(f"{name}\n(n={len(ms)})")
    fig, ax = plt.subplots(figsize=(9, 4))
    if data:
        ax.boxplot(data, tick_labels=names, whis=(1, 99), showfliers=True)
        ax.set_yscale("log")
    ax.set_ylabel("duration (ms)")
    ax.set_title("Turnaround, stage by stage (whiskers: p1–p99)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_regret(curves: dict, path: Path) -> Path:
    """Regret vs switching cost C on log–log axes, with Monte Carlo bands and the √C heuristic scale."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    c = curves["C"]
    for key, color, label in (("regret_static", "tab:blue", "vs best static"),
                              ("regret_offline", "tab:orange", "vs offline optimum")):
        lo, hi = curves[f"{key}_band"]
        ax.plot(c, curves[key], "o-", color=color, label=f"{label} (slope {curves[key.replace('regret', 'slope')]:.2f})")
        ax.fill_between(c, lo, hi, color=color, alpha=0.15)
    ax.plot(c, curves["heuristic_scale"], "k--", lw=1, label="2√(ΓCV₁T): heuristic scale, not a bound")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("switching cost C (s, measured × scale)")
    ax.set_ylabel("regret (s of training time)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_diloco_envelope(seed_rate: dict, rates: dict, path: Path) -> Path:
    """Per-seed SLO violation rate: WA and WA+EWMA against the matched-random envelope (min–max over draws),
    with the no-sync load match and the offline bound."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    n = len(seed_rate["no_sync"])
    x = np.arange(1, n + 1)
    if "random_schedule" in rates:
        draws = rates["random_schedule"]
        ax.fill_between(x, draws.min(axis=1), draws.max(axis=1), color="0.85", step="mid",
                        label="matched random (schedule), draw envelope")
        ax.plot(x, seed_rate["random_schedule"], color="0.45", lw=1, drawstyle="steps-mid", label="matched random, draw mean")
    styles = {"wa_ewma": ("o", "C0", "WA+EWMA"), "wa": ("s", "C1", "WA"), "random_policy": ("x", "C2", "matched random (policy)"),
              "fixed_period": ("+", "C4", "fixed period"), "no_sync": ("_", "k", "no sync (load match)"),
              "offline_bound": ("v", "C3", "offline bound (non-deployable)")}
    for policy, (marker, color, label) in styles.items():
        if policy in seed_rate:
            ax.plot(x, seed_rate[policy], marker, color=color, ls="none", ms=7, label=label)
    ax.set_xlabel("seed")
    ax.set_ylabel("SLO violation rate (%)")
    ax.set_xticks(x)
    ax.legend(fontsize=7, ncols=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
