"""`harness traces inspect|convert|generate|replay`: look at, normalise, synthesise and replay traces."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.commands import SEED, TIMEOUT_S, integer, number
from harness.errors import InputError

if TYPE_CHECKING:  # annotations only: numpy and pandas are imported where a command runs
    import numpy as np
    import pandas as pd


def register(subparsers) -> None:
    parser = subparsers.add_parser("traces", help="inspect, convert, generate and replay traces",
                                   description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="traces_command", metavar="ACTION", parser_class=type(parser))
    sub.required = True

    inspect = sub.add_parser("inspect", help="rows, span, rate over time, token or traffic statistics")
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--bin-s", type=number(0, 1e9, above=True), default=None, help="rate bin width (default: span/20)")
    inspect.add_argument("--plot", metavar="PNG", help="request rate plot, or per-layer traffic heatmap for MoE")
    _moe_options(inspect)
    inspect.set_defaults(func=cmd_inspect)

    convert = sub.add_parser("convert", help="any supported format -> canonical Parquet (or CSV for requests)")
    convert.add_argument("source")
    convert.add_argument("dest")
    _moe_options(convert)
    convert.set_defaults(func=cmd_convert)

    gen = sub.add_parser("generate", help="seeded synthetic traces with ground truth")
    gen.add_argument("kind", choices=["moe", "poisson", "mmpp", "diloco"])
    gen.add_argument("--out", required=True, help="Parquet output")
    gen.add_argument("--seed", type=SEED, required=True)
    gen.add_argument("--truth-out", help="write ground truth (regime changes / burst windows) as JSON here")
    gen.add_argument("--duration-s", type=number(0, 30 * 86400, above=True), default=600.0)
    gen.add_argument("--rate", type=number(0, 1e6, above=True), default=5.0, help="poisson rate, or mmpp base rate (1/s)")
    gen.add_argument("--burst-rate", type=number(0, 1e6, above=True), default=50.0)
    gen.add_argument("--mean-burst-s", type=number(0, 1e7, above=True), default=5.0)
    gen.add_argument("--mean-gap-s", type=number(0, 1e7, above=True), default=30.0)
    gen.add_argument("--count", type=integer(1, 100_000), default=5, help="diloco: number of sync windows")
    gen.add_argument("--window-s", type=number(0, 1e7, above=True), default=8.0)
    gen.add_argument("--min-gap-s", type=number(0, 1e7), default=18.0)
    gen.add_argument("--sync-bytes", type=integer(1, 2**62), default=2 * 10**9)
    gen.add_argument("--iterations", type=integer(1, 100_000), default=50)
    gen.add_argument("--layers", type=integer(1, 1024), default=4)
    gen.add_argument("--micro-batches", type=integer(1, 1024), default=2)
    gen.add_argument("--experts", type=integer(1, 4096), default=16)
    gen.add_argument("--top-k", type=integer(1, 4096), default=2)
    gen.add_argument("--ep", type=integer(1, 4096), default=8)
    gen.add_argument("--regions", type=integer(1, 1024), default=1)
    gen.add_argument("--tokens-per-micro-batch", type=integer(1, 2**31), default=4096)
    gen.add_argument("--hidden-size", type=integer(1, 2**20), default=4096)
    gen.add_argument("--dtype-bytes", type=integer(1, 16), default=2)
    gen.add_argument("--zipf-s", type=number(0, 100), default=1.2)
    gen.add_argument("--drift", type=number(0, 1), default=0.02)
    gen.add_argument("--regime-changes", default="2", help="a count, or comma-separated iterations")
    gen.set_defaults(func=cmd_generate)

    rep = sub.add_parser("replay", help="replay a request trace against an OpenAI-compatible endpoint")
    rep.add_argument("path")
    rep.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    rep.add_argument("--log", required=True, help="replay log (JSON Lines, appended)")
    rep.add_argument("--parquet", help="also convert the log to this Parquet file")
    rep.add_argument("--model", default="emulated-llm")
    rep.add_argument("--time-scale", type=number(0, 1e6, above=True), default=1.0)
    rep.add_argument("--timeout-s", type=TIMEOUT_S, default=60.0)
    rep.add_argument("--max-connections", type=integer(1, 65536), default=256)
    rep.add_argument("--limit", type=integer(0, 2**62), default=0, help="only the first N requests")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_replay)


def _moe_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("MoE routing imports (HarMoEny, FLAME, Megatron layouts)")
    group.add_argument("--hidden-size", type=integer(1, 2**20))
    group.add_argument("--dtype-bytes", type=integer(1, 16), default=2)
    group.add_argument("--top-k", type=integer(1, 4096))
    group.add_argument("--ep", type=integer(1, 4096))
    group.add_argument("--num-experts", type=integer(1, 4096))
    group.add_argument("--tokens-per-micro-batch", type=integer(1, 2**31))
    group.add_argument("--micro-batches", type=integer(1, 1024), default=1)
    group.add_argument("--forward-only", action="store_true", help="no backward-pass phases")


# ---- loading -----------------------------------------------------------------------------------------

def _load_any(path: str, args) -> tuple[str, object]:
    """('requests', DataFrame) | ('sync_windows', DataFrame) | ('moe', MoeTrace)."""
    from traces.moe import load_moe
    from traces.requests import detect_format, load_requests, load_sync_windows
    from traces.schema import parquet_kind

    p = Path(path)
    if not p.exists():
        raise InputError("no such file or directory", file=path)
    if p.is_file():
        try:
            fmt = detect_format(p)
        except InputError:
            fmt = None
        if fmt == "parquet":
            kind = parquet_kind(p)
            if kind == "sync_windows":
                return "sync_windows", load_sync_windows(p)
            if kind in (None, "requests"):
                try:
                    return "requests", load_requests(p)
                except InputError:
                    if kind == "requests":
                        raise
        elif fmt == "sync-windows-csv":
            return "sync_windows", load_sync_windows(p)
        elif fmt is not None:
            return "requests", load_requests(p)
    return "moe", load_moe(p, hidden_size=args.hidden_size, dtype_bytes=args.dtype_bytes, top_k=args.top_k,
                           ep=args.ep, num_experts=args.num_experts, backward=not args.forward_only,
                           tokens_per_micro_batch=args.tokens_per_micro_batch, micro_batches=args.micro_batches)


# ---- inspect -----------------------------------------------------------------------------------------

def _describe(values: np.ndarray) -> dict:
    import numpy as np

    if not len(values):
        return {"sum": 0}
    return {"sum": int(values.sum()), "mean": float(values.mean()), "median": float(np.median(values)),
            "p99": float(np.percentile(values, 99)), "max": int(values.max())}


def request_stats(frame: pd.DataFrame, bin_s: float | None = None) -> dict:
    import numpy as np

    arrival = frame["arrival_s"].to_numpy(dtype=float)
    span = float(arrival[-1] - arrival[0]) if len(arrival) else 0.0
    bin_s = bin_s or max(span / 20, 1e-3)
    edges = np.arange(arrival[0], arrival[-1] + bin_s, bin_s) if len(arrival) else np.array([0.0, bin_s])
    if len(edges) < 2:
        edges = np.array([edges[0], edges[0] + bin_s])
    counts, _ = np.histogram(arrival, bins=edges)
    stats = {"kind": "requests", "rows": int(len(frame)), "start_s": float(arrival[0]) if len(arrival) else 0.0,
             "span_s": span, "mean_rate_per_s": (len(frame) / span) if span > 0 else None,
             "rate_bin_s": bin_s, "rate_per_s": (counts / bin_s).round(4).tolist(),
             "prompt_tokens": _describe(frame["prompt_tokens"].to_numpy()),
             "output_tokens": _describe(frame["output_tokens"].to_numpy())}
    if "prefix_block_ids" in frame.columns:
        blocks = frame["prefix_block_ids"].dropna()
        flat = np.concatenate([np.asarray(b, dtype=np.int64) for b in blocks]) if len(blocks) else np.empty(0)
        stats["prefix_blocks"] = {"total": int(len(flat)), "distinct": int(len(np.unique(flat)))}
    if "session_id" in frame.columns:
        stats["sessions"] = int(frame["session_id"].nunique())
    return stats


def moe_stats(trace) -> dict:
    traffic = trace.traffic
    by_phase = traffic.groupby("phase", observed=True)["bytes"].sum()
    per_iter = traffic.groupby("iteration")["bytes"].sum().to_numpy()
    off_diag = traffic[traffic["src_rank"] != traffic["dst_rank"]]["bytes"].sum()
    return {"kind": "moe", "rows": int(len(traffic)), "header": json.loads(trace.header.to_json()),
            "iterations": int(traffic["iteration"].nunique()), "layers": int(traffic["layer"].nunique()),
            "micro_batches": int(traffic["micro_batch"].nunique()),
            "bytes_total": int(traffic["bytes"].sum()), "bytes_on_wire": int(off_diag),
            "bytes_by_phase": {str(k): int(v) for k, v in by_phase.items()},
            "bytes_per_iteration": _describe(per_iter), "regime_changes": list(trace.regime_changes)}


def sync_stats(frame: pd.DataFrame) -> dict:
    return {"kind": "sync_windows", "rows": int(len(frame)),
            "span_s": float((frame["start_s"] + frame["duration_s"]).max() - frame["start_s"].min()) if len(frame) else 0,
            "busy_s": float(frame["duration_s"].sum()), "bytes": _describe(frame["bytes"].to_numpy())}


def _print_human(stats: dict) -> None:
    for key, value in stats.items():
        if key == "rate_per_s":
            shown = ", ".join(f"{v:.3g}" for v in value)
            print(f"{key:>16}: [{shown}]")
        elif isinstance(value, dict):
            print(f"{key:>16}: " + ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in value.items()))
        else:
            print(f"{key:>16}: {value}")


def _plot_heatmap(trace, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    n = trace.header.n_ranks
    dispatch = trace.traffic[trace.traffic["phase"] == "dispatch_fwd"]
    layers = sorted(dispatch["layer"].unique())
    cols = min(4, max(1, len(layers)))
    rows = -(-max(1, len(layers)) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows), squeeze=False)
    for ax, layer in zip(axes.ravel(), layers):
        part = dispatch[dispatch["layer"] == layer]
        matrix = np.zeros((n, n))
        np.add.at(matrix, (part["src_rank"].to_numpy(), part["dst_rank"].to_numpy()), part["bytes"].to_numpy())
        image = ax.imshow(matrix / 1e9, cmap="viridis")
        ax.set_title(f"layer {layer} dispatch (GB)")
        ax.set_xlabel("dst rank")
        ax.set_ylabel("src rank")
        fig.colorbar(image, ax=ax, shrink=0.8)
    for ax in axes.ravel()[len(layers):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def cmd_inspect(args) -> int:
    kind, data = _load_any(args.path, args)
    if kind == "requests":
        stats = request_stats(data, args.bin_s)
    elif kind == "moe":
        stats = moe_stats(data)
    else:
        stats = sync_stats(data)
    stats = {"path": args.path, **stats}
    if args.plot:
        if kind == "requests":
            from harness.plots import plot_request_rate

            plot_request_rate(stats, args.plot)
        elif kind == "moe":
            _plot_heatmap(data, args.plot)
        else:
            raise InputError("plots exist for request and MoE traces only", file=args.path)
    if args.json:
        json.dump(stats, sys.stdout, indent=1)
        print()
    else:
        _print_human(stats)
    return 0


# ---- convert / generate / replay ---------------------------------------------------------------------

def cmd_convert(args) -> int:
    from traces.schema import write_moe, write_requests, write_sync_windows

    kind, data = _load_any(args.source, args)
    dest = Path(args.dest)
    if dest.suffix == ".csv":
        if kind == "moe":
            raise InputError("MoE traces convert to Parquet only (the header lives in its metadata)", file=args.dest)
        frame = data.copy()
        if "prefix_block_ids" in frame.columns:
            frame["prefix_block_ids"] = frame["prefix_block_ids"].map(json.dumps)
        frame.to_csv(dest, index=False)
    elif kind == "requests":
        write_requests(data, dest)
    elif kind == "moe":
        write_moe(data, dest)
    else:
        write_sync_windows(data, dest)
    rows = len(data.traffic) if kind == "moe" else len(data)
    print(f"wrote {dest} ({kind}, {rows} rows)")
    return 0


def cmd_generate(args) -> int:
    from traces import generate as gen
    from traces.schema import write_moe, write_requests, write_sync_windows

    try:
        if args.kind == "moe":
            changes = [int(c) for c in args.regime_changes.split(",")] if "," in args.regime_changes \
                else int(args.regime_changes)
            trace = gen.generate_moe(seed=args.seed, iterations=args.iterations, layers=args.layers,
                                     micro_batches=args.micro_batches, num_experts=args.experts, top_k=args.top_k,
                                     ep=args.ep, regions=args.regions, tokens_per_micro_batch=args.tokens_per_micro_batch,
                                     hidden_size=args.hidden_size, dtype_bytes=args.dtype_bytes, zipf_s=args.zipf_s,
                                     drift=args.drift, regime_changes=changes)
            write_moe(trace, args.out)
            truth = {"regime_changes": list(trace.regime_changes)}
        elif args.kind == "poisson":
            write_requests(gen.poisson_arrivals(seed=args.seed, rate=args.rate, duration_s=args.duration_s), args.out)
            truth = {}
        elif args.kind == "mmpp":
            bursty = gen.mmpp_arrivals(seed=args.seed, base_rate=args.rate, burst_rate=args.burst_rate,
                                       duration_s=args.duration_s, mean_burst_s=args.mean_burst_s,
                                       mean_gap_s=args.mean_gap_s)
            write_requests(bursty.requests, args.out)
            truth = {"bursts": bursty.bursts.to_dict(orient="records")}
        else:
            windows = gen.diloco_sync_windows(seed=args.seed, count=args.count, duration_s=args.duration_s,
                                              window_s=args.window_s, min_gap_s=args.min_gap_s,
                                              bytes_per_sync=args.sync_bytes)
            write_sync_windows(windows, args.out)
            truth = {}
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if args.truth_out:
        Path(args.truth_out).write_text(json.dumps(truth, indent=1) + "\n")
    print(json.dumps({"wrote": args.out, "seed": args.seed, **truth}))
    return 0


def cmd_replay(args) -> int:
    from traces.replay import ReplayConfig, replay, replay_log_to_parquet
    from traces.requests import load_requests

    requests = load_requests(args.path)
    if args.limit:
        requests = requests.iloc[: args.limit]
    if not args.url.startswith(("http://", "https://")):
        raise InputError(f"--url must start with http:// or https://, got {args.url!r}")
    try:
        config = ReplayConfig(url=args.url, model=args.model, time_scale=args.time_scale, timeout_s=args.timeout_s,
                              max_connections=args.max_connections)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    summary = replay(requests, config, args.log)
    if args.parquet:
        replay_log_to_parquet(args.log, args.parquet)
    out = {"requests": summary.requests, "by_status": summary.by_status, "send_error_us": summary.send_error_us,
           "ttft_ms": summary.ttft_ms, "duration_s": summary.duration_s, "max_in_flight": summary.max_in_flight,
           "log": summary.log_path}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        _print_human(out)
    return 0 if summary.by_status["ok"] == summary.requests else 1
