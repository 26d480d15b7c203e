"""PNG plots for run reports (matplotlib, no display)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.stages import STAGE_TABLE  # noqa: E402

STAGE_STEPS = [(s.label, s.name, s.after) for s in STAGE_TABLE if s.up and s.after and not s.optional]


# the verdict plot's reference delays: grey shades and their own dash patterns, so no curve colour is reused
REFERENCE_DELAYS = {"paper_ms": ("0.35", (0, (6, 2)), "paper's delay"),
                    "ocs_mean_ms": ("0.15", (0, (1, 1.5)), "measured OCS, cycle mean"),
                    "total_mean_ms": ("0.0", (0, (8, 2, 1, 2)), "measured total, cycle mean")}


def _log_ticks(ax, lo: float, hi: float, axis: str = "y") -> None:
    """Every 1-2-5 value of a log axis labelled in plain numbers (not only the powers of ten)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = [m * 10.0 ** e for e in range(-4, 8) for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_locator(NullLocator())


def plot_iteration_vs_delay(series: list[dict], markers: dict, path: Path, calibrated: set[str] | None = None) -> Path:
    """MixNet iteration time / fat-tree vs a constant reconfiguration delay on log axes (the measured NIC
    re-activation on scale): one line per scenario that moves circuits (dashed: its model carries no verdict on
    the scorecard), the claim's threshold, each scenario's break-even d* as a marker where its curve crosses the
    threshold, and the paper's 25 ms and the measured delays as grey verticals labelled on the plot. The legend
    sits below the axes; values off the axes are named in it."""
    fig, ax = plt.subplots(figsize=(11, 6.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    static = sorted({s["scenario"].split("@")[0] for s in series if not s["moves_circuits"]})
    moving = [s for s in series if s["moves_circuits"]]
    lo, hi = (min(s["delay_ms"][0] for s in series), max(s["delay_ms"][-1] for s in series)) if series else (0.1, 100)
    top = 1.2
    bound = next((s["bound"] for s in series if s.get("bound")), None)
    for i, s in enumerate(moving):
        color = colors[i % len(colors)]
        ok = calibrated is None or s["scenario"] in calibrated
        d_star = s["break_even_ms"]
        where = "" if d_star is None else f"; d* {d_star:.3g} ms" + ("" if lo <= d_star <= hi else " (off scale)")
        ax.plot(s["delay_ms"], s["ratio"], color=color, ls="-" if ok else "--", lw=1.8 if ok else 1.3,
                label=s["scenario"] + ("" if ok else " (model not scored: no verdict)") + where)
        top = max(top, min(1000.0, max(s["ratio"])))
        if d_star is not None and bound and lo <= d_star <= hi:
            ax.plot([d_star], [bound], marker="D", ms=7, mfc="white", mec=color, mew=2, ls="none", zorder=5)
    if any(s["break_even_ms"] is not None for s in moving) and bound:
        ax.plot([], [], marker="D", ms=7, mfc="white", mec="0.3", mew=2, ls="none",
                label="break-even d*: where a curve crosses the threshold")
    if bound:
        ax.axhline(bound, color="black", lw=1.0, ls="-", zorder=1)
        ax.annotate(f"threshold T_mix = {bound:g} T_ft ({(bound - 1) * 100:g} %)", (lo, bound),
                    xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0.97, top)
    for key, (color, dashes, label) in REFERENCE_DELAYS.items():
        v = markers.get(key)
        if v is None:
            continue
        if lo <= v <= hi:
            ax.axvline(v, color=color, ls=dashes, lw=1.2, zorder=1)
            ax.annotate(f"{label} {v:.4g} ms", (v, 1), xycoords=("data", "axes fraction"), xytext=(-3, -4),
                        textcoords="offset points", rotation=90, ha="right", va="top", fontsize=8, color=color,
                        bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1})
        else:
            ax.plot([], [], " ", label=f"{label} = {v:.4g} ms (off scale)")
    if static:
        ax.plot([], [], " ", label=f"flat at T_mix(0), never move a circuit: {', '.join(static)}")
    _log_ticks(ax, 0.97, top)
    _log_ticks(ax, lo, hi, "x")
    ax.grid(alpha=0.25, which="major")
    ax.set_xlabel("constant delay per reconfiguration (ms, log)")
    ax.set_ylabel("MixNet iteration time / fat-tree, T_mix/T_ft (log)")
    ax.set_title("Where the iteration-time verdict flips", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncols=2, frameon=False)
    rows = -(-len(labels) // 2)
    fig.tight_layout(rect=(0, min(0.45, 0.032 * rows + 0.01), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_stage_breakdown(events: pd.DataFrame, path: Path) -> Path:
    """Box plot of each turnaround stage's duration (log scale), counted in its own unit: the OCS switch once per
    cycle (its ends are the cycle's command), a port stage once per port and cycle. A duration at or below zero
    (light seen before the switch reported completion) cannot sit on a log axis: its count is named instead."""
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
        per_cycle = later in cyc and earlier in cyc
        frame = cyc if per_cycle else absolute
        if later not in frame or earlier not in frame:
            continue
        ms = ((frame[later] - frame[earlier]) / 1e6).dropna()
        if not len(ms):
            continue
        cycles = ms.index.nunique() if per_cycle else ms.index.get_level_values("cycle").nunique()
        unit = f"n={len(ms)} cycles" if per_cycle else f"n={len(ms)} ports\n({cycles} cycles)"
        positive = ms[ms > 0]
        skipped = len(ms) - len(positive)
        data.append(positive.to_numpy())
        names.append(f"{name}\n{unit}" + (f"\n{skipped} ≤ 0 not shown" if skipped else ""))
    fig, ax = plt.subplots(figsize=(10, 4.4))
    if data:
        ax.boxplot(data, tick_labels=names, whis=(1, 99), showfliers=True)
        ax.set_yscale("log")
        ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("duration (ms, log)")
    ax.set_title("Turnaround, stage by stage (whiskers: p1–p99)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_request_rate(stats: dict, out: str) -> None:
    """A request trace's rate over time, bin by bin; the rate axis starts at zero (a rate is read against none)."""
    rate = np.asarray(stats["rate_per_s"])
    t = stats["start_s"] + np.arange(len(rate)) * stats["rate_bin_s"]
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.step(t, rate, where="post")
    ax.set_ylim(0, max(1.0, float(rate.max()) * 1.08) if len(rate) else 1.0)
    ax.set_xlabel("trace time (s)")
    ax.set_ylabel("requests/s")
    ax.set_title(f"{stats['rows']} requests, bins of {stats['rate_bin_s']:.3g} s")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_gpu_view(samples: pd.DataFrame, windows: np.ndarray, path) -> None:
    """The GPU view over time: per sampled host, its GPUs' mean utilisation and their summed power, seconds since
    the first sample, each re-training window (a cycle: OCS command to the last port ACTIVE) shaded. `samples`:
    gpu_samples.jsonl; `windows`: (begin_ns, end_ns) rows (`harness.gpu_view.run_windows`)."""
    t0 = min(int(samples["t_ns"].min()), int(windows[:, 0].min(initial=samples["t_ns"].min())))
    spans = np.column_stack([(windows[:, 0] - t0) / 1e9, (windows[:, 1] - windows[:, 0]) / 1e9])
    hosts = list(dict.fromkeys(samples["host"]))
    gpus = samples.groupby("host")["gpu"].nunique()
    fig, (util, power) = plt.subplots(2, 1, figsize=(11, 5.6), sharex=True)
    for ax in (util, power):  # one collection a panel (~10^5 windows a campaign), edges: windows back to back
        ax.broken_barh(spans, (0, 1), transform=ax.get_xaxis_transform(), fc="0.87", ec="0.6", lw=0.6)
    for host in hosts:
        mine = samples[samples["host"] == host]
        at = mine.groupby("t_ns")
        x = (np.asarray(list(at.groups)) - t0) / 1e9
        line, = util.plot(x, at["utilization_gpu"].mean().to_numpy(), lw=1, label=f"{host} ({gpus[host]} GPUs)")
        power.plot(x, at["power_w"].sum(min_count=1).to_numpy(), lw=1, color=line.get_color())
    util.set_ylim(0, 105)
    util.set_ylabel("utilisation, mean of\nthe host's GPUs (%)")
    power.set_ylim(bottom=0)
    power.set_ylabel("power, sum of\nthe host's GPUs (W)")
    power.set_xlabel("s since the first sample")
    if len(windows):
        util.plot([], [], color="0.85", lw=8, label="re-training window\n(OCS command → last port ACTIVE)")
    util.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    util.set_title(f"GPUs while the network re-trains: {len(windows)} windows (one per cycle), {len(hosts)} hosts, "
                   f"{len(samples)} samples (one per GPU and query)", fontsize=10)
    for ax in (util, power):
        ax.grid(alpha=0.25)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


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
