"""PNG plots for run reports (matplotlib, no display)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

STAGE_STEPS = [("OCS switch", "ocs_command_completed", "ocs_command_sent"),
               ("LOS clear", "light_detected", "ocs_command_completed"),
               ("CDR lock", "cdr_locked", "light_detected"),
               ("PHY up", "phy_up", "cdr_locked"),
               ("port active", "port_active", "phy_up"),
               ("first packet", "first_packet", "port_active")]


def plot_iteration_vs_delay(panels: list[dict], path: Path) -> Path:
    """One panel per model × link: MixNet iteration time vs a constant reconfiguration delay, the fat-tree
    line, and markers at 25 ms, the measured OCS and total means and the break-even delay."""
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        d = panel["delay_ms"]
        ax.plot(d, panel["t_mixnet_s"], color="tab:blue", label="MixNet")
        ax.axhline(panel["t_fat_tree_s"], color="black", lw=1, label="fat-tree")
        marks = panel["markers"]
        style = {"paper_ms": ("tab:green", "25 ms (paper)"), "ocs_mean_ms": ("tab:orange", "measured OCS"),
                 "total_mean_ms": ("tab:red", "measured total"), "break_even_ms": ("tab:purple", "break-even d*")}
        for key, (color, label) in style.items():
            if marks.get(key) is not None:
                ax.axvline(marks[key], color=color, ls="--", lw=1, label=label)
        ax.set_xscale("symlog", linthresh=10)
        ax.set_title(f"{panel['model']} @ {panel['link_gbps']} Gb/s", fontsize=9)
        ax.set_xlabel("delay per reconfiguration (ms)", fontsize=8)
        ax.set_ylabel("iteration time (s)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=6, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
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

    fig, ax = plt.subplots(figsize=(8, 4.2))
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
    ax.legend(fontsize=7, ncols=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
