"""`harness report RUN_DIR... --html`: one self-contained HTML page per run, or one comparing several runs.

Self-contained means the page fetches nothing: no scripts, no style sheets, no fonts; every figure is a
matplotlib PNG inlined as a `data:` URI. Every number comes from the run's own record (summary.json,
verdict.json, manifest.json, events.parquet, ground_truth.parquet); a section whose source file is absent
says so instead of being left out silently.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.stages import BY_NAME, STAGES_UP  # noqa: E402
from analysis.stats import MIN_DIFFERENCE_UNITS, MIN_MEAN_UNITS  # noqa: E402

REPORT_NAME = "report.html"
COMPARISON_NAME = "comparison.html"
_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.8em}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;
vertical-align:top;text-align:left}th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.falsified{background:#fbd5d5}.holds{background:#d7f2d7}.inconclusive,.falsified-if{background:#fcefc7}
.missing{color:#888;font-style:italic}.banner{background:#fff4d6;border-left:4px solid #e0a800;padding:.5em 1em}
img{max-width:100%;height:auto}code{font-size:12px}nav.toc{background:#f7f7f7;border:1px solid #ddd;padding:.4em 1em;
display:inline-block}nav.toc ol{margin:.2em 0;padding-left:1.4em}table table{margin:0;font-size:12px}
details>summary{cursor:pointer;color:#225}pre.console{font-size:12px;background:#f7f7f7;padding:.6em;overflow-x:auto;
max-height:40em}.warnings{background:#fff4d6;border-left:4px solid #e0a800;padding:.3em 1em}
ol.notes{font-size:13px}ul.claims li{margin:.3em 0}details.terms{font-size:13px;background:#f7f7f7;padding:.3em 1em}
details.terms dt{font-weight:bold;float:left;clear:left;margin-right:.5em}details.terms dd{margin:0 0 .2em 0}"""


@dataclass
class RunData:
    """One run directory as the report reads it; absent files are None."""

    path: Path
    name: str
    manifest: dict | None
    summary: dict | None
    verdict: dict | None
    events: pd.DataFrame | None
    truth: pd.DataFrame | None


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def load_run(run: Path) -> RunData:
    from harness.eventlog import read_parquet_events

    summary = _json(run / "summary.json")
    events = read_parquet_events(run / "events.parquet") if (run / "events.parquet").exists() else None
    truth = pd.read_parquet(run / "ground_truth.parquet") if (run / "ground_truth.parquet").exists() else None
    summary = summary.get("summary", summary) if summary else None  # the record wraps the run's summary
    return RunData(run, run.name, _json(run / "manifest.json"), summary,
                   _json(run / "verdict.json"), events, truth)


# ------------------------------------------------------------------------------------------ figures
def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return f'<img alt="figure" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _stage_delays_ms(events: pd.DataFrame) -> pd.DataFrame:
    """Per (cycle, host, port): each up-stage's delay after the cycle's OCS command (ms), cycles > 0."""
    from analysis.stats import stage_table

    return stage_table(events[events["cycle"] > 0]) / 1e6


PER_CYCLE = ("ocs_command_completed",)  # a stage of the cycle's command, not of a port


def cdf_figure(runs: list[RunData]) -> str | None:
    """Empirical CDF of every up-stage's delay after the OCS command; one line per run."""
    tables = [(r.name, _stage_delays_ms(r.events)) for r in runs if r.events is not None]
    stages = [s for s in STAGES_UP[1:] if any(s in t and t[s].notna().any() for _, t in tables)]
    if not stages:
        return None
    cols = min(3, len(stages))
    rows = math.ceil(len(stages) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, stage in zip(axes.flat, stages):
        spans = []
        per_cycle = stage in PER_CYCLE
        for name, table in tables:
            column = table[stage].dropna()
            if per_cycle:  # one value per cycle, repeated on every port's row: counted once
                column = column.groupby(level="cycle").first()
            x = np.sort(column.to_numpy())
            if len(x):
                cycles = column.index.get_level_values("cycle").nunique()
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post",
                        label=f"{name} ({cycles} cycles)" if per_cycle else f"{name} ({len(x)} ports, {cycles} cycles)")
                spans += [x[0], x[-1]]
        # runs decades apart (a 25 ms switch beside a 6 s NIC re-activation) share one readable axis
        log = len(spans) > 2 and min(spans) > 0 and max(spans) / min(spans) > 30
        if log:
            ax.set_xscale("log")
        ax.set_title(BY_NAME[stage].label, fontsize=10)
        ax.set_xlabel("ms after OCS command sent" + (" (log)" if log else ""), fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.set_ylabel("fraction of cycles" if per_cycle else "fraction of ports", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(stages):]:
        ax.axis("off")
    fig.tight_layout()
    return _png(fig)


def timeline_figure(run: RunData) -> str | None:
    """Each cycle's stages on one row, ms after that cycle's OCS command: every port's event as a dot, the
    slowest port's first packet (the cycle's turnaround) as a bar."""
    if run.events is None:
        return None
    table = _stage_delays_ms(run.events)
    if table.empty:
        return None
    fig, ax = plt.subplots(figsize=(11, 0.35 * table.index.get_level_values("cycle").nunique() + 1.6))
    cycle = table.index.get_level_values("cycle").to_numpy()
    last = table[[s for s in STAGES_UP[1:] if s in table]].max(axis=1).groupby(level="cycle").max()
    ax.barh(last.index, last.to_numpy(), color="0.9", edgecolor="0.7", height=0.7, label="cycle (its last event)")
    for i, stage in enumerate(STAGES_UP[1:]):
        if stage in table and table[stage].notna().any():
            ax.plot(table[stage].to_numpy(), cycle + (i - 3) * 0.08, "o", ms=3, label=BY_NAME[stage].label)
    ax.set_yticks(last.index)
    ax.invert_yaxis()
    ax.set_xlabel("ms after the cycle's OCS command")
    ax.set_ylabel("cycle")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Cycle timeline — {run.name}", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def accuracy_figure(runs: list[RunData]) -> str | None:
    """Recorded − true time per stage (ms) against the emulator's ground truth, with ± uncertainty."""
    from analysis.accuracy import match

    data = []
    for r in runs:
        if r.events is not None and r.truth is not None:
            m = match(r.events[r.events["cycle"] > 0], r.truth)
            if len(m):
                data.append((r.name, m))
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.6))
    stages = [s for s in STAGES_UP if any((m["stage"] == s).any() for _, m in data)]
    width = 0.8 / len(data)
    for j, (name, m) in enumerate(data):
        for i, stage in enumerate(stages):
            g = m[m["stage"] == stage]
            x = np.full(len(g), i + (j - (len(data) - 1) / 2) * width)
            ax.errorbar(x, g["error_ns"] / 1e6, yerr=g["uncertainty_ns"] / 1e6, fmt="o", ms=2, lw=0.5,
                        alpha=0.6, color=f"C{j}", label=name if i == 0 else None)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(stages)), [BY_NAME[s].label for s in stages], fontsize=8)
    ax.set_ylabel("recorded − true (ms), bar = ± uncertainty")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


# ------------------------------------------------------------------------------------------ tables
def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any, fmt: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return format(value, fmt) if isinstance(value, (int, float)) else _e(value)


def _table(head: list[str], rows: list[list[str]]) -> str:
    """Cells are HTML already (escape with _e / _num)."""
    out = ["<table>" + ("<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" if head else "")]
    for row in rows:
        out.append("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in row) + "</tr>")
    return "".join(out) + "</table>"


def _missing(what: str) -> str:
    return f'<p class="missing">{_e(what)}</p>'


def delays_section(run: RunData) -> str:
    """The stage delays in ms at a fixed precision (3 decimals: µs), as summary.md gives them."""
    from analysis.stats import mean_interval_text
    from harness.record import p99_cell, p99_column

    def ms(v) -> str:
        return _num(v, ".3f")

    delays = (run.summary or {}).get("delays_ms")
    if not delays:
        return _missing("no summary.json delays (the run recorded no measured cycle)")
    extra = {"ocs_switch": "OCS switch, per cycle (completed − sent)",
             "turnaround": "turnaround, per cycle (slowest port's first packet)"}
    items = [(f"{BY_NAME[k].label} ({k})", v) for k, v in delays["stages"].items()
             if not (k == "ocs_command_completed" and "ocs_switch" in delays)]  # the OCS switch row, once
    items += [(label, delays[k]) for k, label in extra.items() if k in delays]
    head, note = p99_column([s for _, s in items])
    rows = [[_e(name), f'<td class="num">{s["n"]}</td>', f'<td class="num">{s["n_cycles"]}</td>',
             f'<td class="num">{ms(s["mean"])}</td>', f'<td class="num">{_e(mean_interval_text(s))}</td>',
             f'<td class="num">{ms(s["p50"])}</td>', f'<td class="num">{ms(s["p99"])}</td>',
             f'<td class="num">{_e(p99_cell(s, head, ms))}</td>'] for name, s in items]
    return (f"<p>{_e(note)}</p>" if note else "") + _table(
        ["delay after OCS command (ms)", "n", "cycles", "mean", "mean 95 % CI (cycles)", "p50", "p99", _e(head)], rows)


def _verdict_class(v: str) -> str:
    return v.replace(" ", "-") if v in ("falsified", "holds", "inconclusive", "falsified if") else ""


def verdict_section(run: RunData) -> str:
    v = run.verdict
    if v is None:
        return _missing("no verdict.json: this playbook evaluated no claims")
    from harness import glossary
    from harness.steps.mixnet import claim_sentences, claims_table, lateness_lines

    prov = v.get("provenance") or {}
    parts = ["<ul class=\"claims\">" + "".join(f"<li><b>{_e(x)}</b></li>" for x in claim_sentences(v)) + "</ul>"]
    if prov.get("emulated"):
        text = f"Emulated bench, not a hardware measurement: delays drawn from profile {prov.get('profile')}."
        if prov.get("copies_published_figures"):
            text += f" That profile copies published figures ({prov['copies_published_figures']})."
        parts.append(f'<p class="banner">{_e(text)}</p>')
    for line in lateness_lines(v):  # the report's note on cycles realised late, as plain text
        if line:
            parts.append(f'<p class="banner">{_e(line.lstrip("> ").replace("**", ""))}</p>')
    t = claims_table(v)
    parts.append(_table(["claim", "verdict", "the bound", "the model's estimate"], [
        [f"<b>{_e(c.statement)}</b><br><code>{_e(c.id)}</code>",
         f'<td class="{_verdict_class(c.verdict_class)}"><b>{_e(c.verdict)}</b></td>', _e(c.bound), _e(c.model)]
        for c in t.claims]))
    parts.append(f"<p><small>{_e(t.assumptions)}</small></p>")
    rows = []
    for r in t.rows:
        cells = [f"<b>{_e(r.scenario)}</b>"]
        for c in r.cells:
            cells.append("–" if c is None else
                         f'<td class="{_verdict_class(c.verdict_class)}">bound: {_e(c.bound)}<br>model: '
                         f'{_e(c.model)} <a href="#note-{c.note}">[{c.note}]</a></td>')
        rows.append(cells)
    notes = "".join(f'<li id="note-{i}">{_e(n)}</li>' for i, n in enumerate(t.notes, 1))
    parts.append("<h3>By scenario</h3>" + _table(["scenario"] + [f"<code>{_e(c.id)}</code>" for c in t.claims], rows) +
                 f"<p><small>{_e(t.legend.replace('*', ''))}</small></p><ol class=\"notes\">{notes}</ol>")
    rob = v.get("robustness") or {}
    if rob.get("table"):
        from harness.steps.mixnet import evidence_words, say

        words = evidence_words(prov)
        ids = [c["id"] for c in v["claims"]]
        rrows = [[_e(r["point"]), _e(", ".join(r.get("model_verdict_scenarios", r.get("calibrated", []))) or "none")] +
                 [f'<td class="{_verdict_class(r["claims"][i])}">{_e(say(r["claims"][i], words))}'
                  f'{_e(" (" + ", ".join(r["falsified_by"][i]) + ")") if r["falsified_by"][i] else ""}</td>'
                  for i in ids] for r in rob["table"]]
        parts.append(f"<h3>Robustness over {rob.get('design_points')} assumption-grid points</h3>" +
                     _table(["grid point", "scenarios with a model verdict"] + [_e(i) for i in ids], rrows))
    png = run.path / "iteration_vs_delay.png"
    if png.exists():
        parts.append(f'<img alt="iteration time vs delay" src="data:image/png;base64,'
                     f'{base64.b64encode(png.read_bytes()).decode()}">')
    # the terms under the claims' sentences: those the section's own text uses
    parts.insert(1, glossary.html_block(html.unescape(re.sub(r"<[^>]+>", " ", "".join(parts)))))
    return "".join(parts)


def accuracy_section(run: RunData) -> str:
    acc = (run.summary or {}).get("accuracy")
    if not acc:
        return _missing("no ground truth (a real bench has none; the emulator records it)")
    rows = [[_e(r["stage"]), f'<td class="num">{r["n"]}</td>', f'<td class="num">{r["abs_err_p50_ms"]:.4f}</td>',
             f'<td class="num">{r["abs_err_p99_ms"]:.4f}</td>', f'<td class="num">{r["bias_ms"]:+.4f}</td>',
             f'<td class="num">{100 * r["coverage"]:.2f} %</td>'] for r in acc]
    table = _table(["stage", "n", "|error| p50 (ms)", "p99 (ms)", "bias (ms)", "true time within ± uncertainty"],
                   rows)
    from harness.finish import lost_line

    lost = run.summary.get("lost_events")
    return table + (f"<p>{_e(lost_line(lost))}</p>" if lost else "")


def _flat(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(obj, dict) and obj:
        return [kv for k, v in obj.items() for kv in _flat(v, f"{prefix}.{k}" if prefix else str(k))]
    return [(prefix, obj)]


def _records(rows: list[dict]) -> str:
    """A list of records as one table, a column per field (nested fields dotted)."""
    flat = [dict(_flat(r)) for r in rows]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    return _table([_e(c) for c in columns], [[_cell(r.get(c)) for c in columns] for r in flat])


def _cell(value: Any) -> str:
    """A recorded value as HTML a reader can read: records as tables, lists joined, nothing as a dash — never
    a Python repr."""
    if value is None or value == "" or value == [] or value == {}:
        return '<span class="missing" title="not reported">–</span>'
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return _num(value)
    if isinstance(value, dict):
        if all(isinstance(v, dict) for v in value.values()):  # records keyed by name: a row each
            return _records([{"": k, **v} for k, v in value.items()])
        return _table([], [[_e(k), _cell(v)] for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, dict) for v in value):
            return _records(list(value))
        return ", ".join(_cell(v) for v in value)
    return f"<code>{_e(value)}</code>"


GPU_PLOT = "gpu_view.png"


def gpu_plot(run: RunData) -> bytes | None:
    """The GPU view over time as PNG bytes (gpu_samples.jsonl and the steps' windows), or None."""
    from harness.gpu_view import run_windows
    from harness.plots import plot_gpu_view

    view = ((run.manifest or {}).get("extra") or {}).get("gpu_view")
    path = run.path / "gpu_samples.jsonl"
    if not view or not path.is_file() or not path.stat().st_size:
        return None
    buf = io.BytesIO()
    plot_gpu_view(pd.read_json(path, lines=True), run_windows(run.path, view), buf)
    return buf.getvalue()


def gpu_section(run: RunData, plot: bytes | None = None) -> str:
    from harness.gpu_view import TABLE_HEAD, table_rows

    view = ((run.manifest or {}).get("extra") or {}).get("gpu_view")
    if not view:
        return _missing("no GPU samples (no nvidia-smi on the hosts, or no reconfiguration step)")
    figure = "" if plot is None else \
        f'<img alt="GPU utilisation and power over time" src="data:image/png;base64,{base64.b64encode(plot).decode()}">'
    return _table(TABLE_HEAD, [[_e(c) for c in row] for row in table_rows(view)]) + figure


def provenance_section(run: RunData) -> str:
    m = run.manifest
    if m is None:
        return _missing("no manifest.json")
    keep = {k: m.get(k) for k in ("created_utc", "status", "run", "playbook", "inventory", "seed", "git", "profile",
                                  "extra")}
    keep["extra"] = {k: v for k, v in (m.get("extra") or {}).items() if k not in ("devices", "gpu_view")}  # own tables
    keep["versions"] = {k: v for k, v in (m.get("versions") or {}).items() if k != "packages"}
    keep["packages"] = (m.get("versions") or {}).get("packages")
    rows = [[_e(k), _cell(v)] for k, v in _flat(keep) if v not in (None, "", {}, [])]
    parts = ["<details><summary>Manifest: playbook, inventory, seed, versions, packages</summary>" +
             _table(["manifest field", "value"], rows) + "</details>"]
    devices = m.get("devices") or (m.get("extra") or {}).get("devices")
    if devices:
        parts.append("<h3>Device identity</h3>" + f"<details><summary>{sum(len(v) if isinstance(v, dict) else 1 for v in devices.values())} devices: switches, NICs and transceivers, GPUs</summary>" + _table(["kind", "device", "identity"], [
            [_e(kind), _e(name), _cell(ident)] for kind, named in devices.items()
            for name, ident in (named.items() if isinstance(named, dict) else [("", named)])]) + "</details>")
    else:
        parts.append(_missing("device identity: not recorded by this run"))
    rows = []
    for c in m.get("clock") or []:
        seg = (c.get("segments") or [{}])[-1]
        truth = (m.get("emulated_clocks") or {}).get(c.get("host"), {})
        rows.append([_e(c.get("host", "?")), f'<td class="num">{len(c.get("segments") or [])}</td>',
                     f'<td class="num">{_num(seg.get("samples"))}</td>',
                     f'<td class="num">{_num((seg.get("uncertainty_ns") or math.nan) / 1e3, ".1f")}</td>',
                     f'<td class="num">{_num(seg.get("drift_ppm"), ".2f")}</td>',
                     f'<td class="num">{_num(truth.get("drift_ppm"), ".2f")}</td>',
                     f'<td class="num">{len(c.get("steps") or [])}</td>', _e(_reply_stamps(c.get("reply_stamps")))])
    if rows:
        parts.append("<h3>Host clocks</h3>" + _table(
            ["host", "fit segments", "samples (last)", "offset bound (µs)", "drift (ppm)",
             "true drift (emulator, ppm)", "clock steps", "probe replies dated by"], rows))
    return "".join(parts)


def _reply_stamps(r: dict | None) -> str:
    from harness.finish import read_dated

    if not r:
        return "–"  # a run recorded before this was kept
    read = read_dated(r)
    return "kernel receive stamp" if read is None else f"read time ({read})"


def _anchor(text: str, taken: set[str]) -> str:
    base = "-".join(re.findall(r"[a-z0-9]+", text.lower())) or "section"
    anchor, k = base, 1
    while anchor in taken:
        k += 1
        anchor = f"{base}-{k}"
    taken.add(anchor)
    return anchor


def html_page(title: str, body: list[str]) -> str:
    """The page: a table of contents of its sections (every `<h2>` gets an anchor), then the body."""
    taken: set[str] = set()
    toc, out = [], []
    for part in body:
        heading = re.fullmatch(r"<h2>(.*)</h2>", part, re.S)
        if heading:
            anchor = _anchor(html.unescape(re.sub(r"<[^>]+>", "", heading.group(1))), taken)
            toc.append(f'<li><a href="#{anchor}">{heading.group(1)}</a></li>')
            part = f'<h2 id="{anchor}">{heading.group(1)}</h2>'
        out.append(part)
    if toc:
        at = next((i + 1 for i, p in enumerate(out) if p.startswith("<h1")), 0)
        out.insert(at, '<nav class="toc"><b>Contents</b><ol>' + "".join(toc) + "</ol></nav>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
            "style-src 'unsafe-inline'\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(out) +
            "\n</body></html>\n")


def warnings_section(run: RunData) -> str:
    """Every warning the run's record carries (the console printed the same), or nothing."""
    from harness.finish import emulator_line, lost_line

    s = run.summary or {}
    found = []
    if (s.get("emulator") or {}).get("warning"):
        found.append(emulator_line(s["emulator"]))
    if (s.get("lost_events") or {}).get("in_ok_cycles"):
        found.append(lost_line(s["lost_events"]))
    for host, stamps in (s.get("clock_replies_by_read") or {}).items():
        found.append(f"host {host}: clock probe replies dated by their read, not the kernel ({_reply_stamps(stamps)})")
    for name, step in (s.get("steps") or {}).items():
        found += [f"step {name}: {c.get('name')}: {c.get('detail', '')}" for c in step.get("checks", [])
                  if not c.get("ok", True)]
    if not found:
        return ""
    return '<div class="warnings"><b>Warnings</b><ul>' + "".join(f"<li>{_e(w)}</li>" for w in found) + "</ul></div>"


def console_section(run: RunData) -> str:
    path = run.path / "console.log"
    if not path.is_file():
        return _missing("no console.log in this run directory")
    return (f"<details><summary>console.log ({path.stat().st_size} bytes)</summary>"
            f'<pre class="console">{_e(path.read_text(errors="replace"))}</pre></details>')


def _fig_or_missing(fig: str | None, what: str) -> str:
    return fig if fig else _missing(what)


def _status_line(run: RunData) -> str:
    s = run.summary or {}
    pb = (run.manifest or {}).get("playbook") or {}
    wall = "" if s.get("wall_s") is None else f" in {s['wall_s']:.1f} s"
    return (f"<p>Playbook <code>{_e(pb.get('name', '?'))}</code> on <code>{_e(s.get('bench', '?'))}</code>: "
            f"<b>{_e(s.get('status', 'no summary'))}</b>{wall}; faults: {_e(s.get('faults', '?'))}; "
            f"seed {_e((run.manifest or {}).get('seed', '?'))}.</p>")


def run_page(run: RunData, gpu_png: bytes | None = None) -> str:
    return html_page(f"Run {run.name}", [
        f"<h1>Run {_e(run.name)}</h1>", _status_line(run), warnings_section(run),
        "<h2>Verdict</h2>", verdict_section(run),
        "<h2>Stage delays</h2>", delays_section(run),
        _fig_or_missing(cdf_figure([run]), "no events.parquet"),
        "<h2>Cycle timeline</h2>", _fig_or_missing(timeline_figure(run), "no measured cycle"),
        "<h2>Accuracy against ground truth</h2>", accuracy_section(run),
        _fig_or_missing(accuracy_figure([run]), "no ground_truth.parquet"),
        "<h2>GPUs while the network re-trains</h2>", gpu_section(run, gpu_png),
        "<h2>Provenance</h2>", provenance_section(run),
        "<h2>Console output</h2>", console_section(run)])


COMPARED = (("ocs_switch", "OCS switch, per cycle"), *((s, BY_NAME[s].label) for s in STAGES_UP[2:]),
            ("turnaround", "turnaround, per cycle (slowest port's first packet)"))


def difference_rows(runs: list[RunData]) -> list[dict]:
    """Each later run against the first, per stage: means over per-cycle values (the cycle is the unit) with
    their intervals, the difference of means with its interval (two-sample studentised bootstrap, coverage in
    benchmarks/coverage_difference.py) and the ratio of means."""
    from analysis.stats import cycle_units, mean_difference_interval, mean_interval

    base = runs[0]
    units = {r.name: cycle_units(r.events) if r.events is not None else {} for r in runs}
    rows = []
    for other in runs[1:]:
        for stage, label in COMPARED:
            a = units[base.name].get(stage, np.array([])) / 1e6
            b = units[other.name].get(stage, np.array([])) / 1e6
            if not (len(a) or len(b)):
                continue
            mean_a = float(a.mean()) if len(a) else None
            mean_b = float(b.mean()) if len(b) else None
            rows.append({"A": base.name, "B": other.name, "stage": stage, "label": label,
                         "cycles_A": int(len(a)), "cycles_B": int(len(b)), "mean_A_ms": mean_a, "mean_B_ms": mean_b,
                         "mean_A_ci": mean_interval(a), "mean_B_ci": mean_interval(b),
                         "difference_ms": None if mean_a is None or mean_b is None else mean_b - mean_a,
                         "difference_ci": mean_difference_interval(a, b),
                         "ratio": mean_b / mean_a if mean_a and mean_b is not None else None})
    return rows


def _ms_with_interval(value: float | None, ci: list[float] | None, needs: int) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f" (an interval needs ≥ {needs} cycles)")


def difference_markdown(runs: list[RunData]) -> str:
    """The comparison as a table a terminal or a report takes: per stage, then per claim."""
    lines = ["| stage | A | B | cycles A/B | mean A (ms) [95 % CI] | mean B (ms) [95 % CI] | B − A (ms) [95 % CI] "
             "| B / A |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in difference_rows(runs):
        lines.append(f"| {r['label']} | {r['A']} | {r['B']} | {r['cycles_A']}/{r['cycles_B']} | "
                     f"{_ms_with_interval(r['mean_A_ms'], r['mean_A_ci'], MIN_MEAN_UNITS)} | "
                     f"{_ms_with_interval(r['mean_B_ms'], r['mean_B_ci'], MIN_MEAN_UNITS)} | "
                     f"{_ms_with_interval(r['difference_ms'], r['difference_ci'], MIN_DIFFERENCE_UNITS)} | "
                     f"{'–' if r['ratio'] is None else format(r['ratio'], '.3g')} |")
    claims = claim_rows(runs)
    if claims:
        lines += ["", "| claim | " + " | ".join(r.name for r in runs) + " |", "|---|" + "---|" * len(runs)]
        lines += [f"| {c} | " + " | ".join(v.get(r.name, "–") for r in runs) + " |" for c, v in claims.items()]
    return "\n".join(lines)


def claim_rows(runs: list[RunData]) -> dict[str, dict[str, str]]:
    """claim id -> run -> its verdict, for runs with a verdict."""
    out: dict[str, dict[str, str]] = {}
    for r in runs:
        for claim in (r.verdict or {}).get("claims", []):
            out.setdefault(claim["id"], {})[r.name] = claim["verdict"]
    return out


def differences_section(runs: list[RunData]) -> str:
    rows = difference_rows(runs)
    if not rows:
        return _missing("no run has measured cycles to compare")
    head = ["stage", "A", "B", "cycles A / B", "mean A (ms) [95 % CI]", "mean B (ms) [95 % CI]",
            "B − A (ms) [95 % CI]", "B / A"]
    table = _table(head, [[_e(r["label"]), _e(r["A"]), _e(r["B"]),
                           f'<td class="num">{r["cycles_A"]} / {r["cycles_B"]}</td>',
                           f'<td class="num">{_ms_with_interval(r["mean_A_ms"], r["mean_A_ci"], MIN_MEAN_UNITS)}</td>',
                           f'<td class="num">{_ms_with_interval(r["mean_B_ms"], r["mean_B_ci"], MIN_MEAN_UNITS)}</td>',
                           f'<td class="num">{_ms_with_interval(r["difference_ms"], r["difference_ci"], MIN_DIFFERENCE_UNITS)}</td>',
                           f'<td class="num">{"–" if r["ratio"] is None else format(r["ratio"], ".3g")}</td>']
                          for r in rows])
    note = ("<p>Means over per-cycle values (a port stage: the mean of the cycle's ports), so the cycle is the "
            "unit of replication; intervals are bootstrap-t, the difference's a two-sample one.</p>")
    claims = claim_rows(runs)
    if claims:
        table += "<h3>Claims</h3>" + _table(["claim"] + [_e(r.name) for r in runs], [
            [f"<code>{_e(c)}</code>"] + [f'<td class="{_verdict_class(v.get(r.name, ""))}">{_e(v.get(r.name, "–"))}</td>'
                                        for r in runs] for c, v in claims.items()])
    return note + table


def comparison_page(runs: list[RunData]) -> str:
    body = [f"<h1>Comparison of {len(runs)} runs</h1>",
            _table(["run", "status"], [[_e(r.name), _status_line(r)] for r in runs]),
            "<h2>Differences against the first run</h2>", differences_section(runs),
            "<h2>Stage delays, per-stage CDFs</h2>", _fig_or_missing(cdf_figure(runs), "no events.parquet"),
            "<h2>Accuracy against ground truth</h2>",
            _fig_or_missing(accuracy_figure(runs), "no run has ground truth")]
    for r in runs:
        body += [f"<h2>{_e(r.name)}</h2>", warnings_section(r), "<h3>Verdict</h3>", verdict_section(r),
                 "<h3>Stage delays</h3>", delays_section(r),
                 _fig_or_missing(timeline_figure(r), "no measured cycle"),
                 "<h3>Accuracy</h3>", accuracy_section(r), "<h3>GPUs while the network re-trains</h3>",
                 gpu_section(r), "<details><summary>Provenance</summary>" + provenance_section(r) + "</details>"]
    return html_page(f"Comparison of {len(runs)} runs", body)


def write_html(run_dirs: list[Path], out: Path | None = None) -> Path:
    """report.html in the one run directory, or comparison.html (in `out`'s folder or the first run's)."""
    from harness import record as rec

    runs = [load_run(Path(d)) for d in run_dirs]
    if len(runs) == 1:
        path = out or runs[0].path / REPORT_NAME
        gpu_png = gpu_plot(runs[0])
        if gpu_png is not None:  # the same figure as a file beside the page
            rec.write_bytes_atomic(path.with_name(GPU_PLOT), gpu_png)
        text = run_page(runs[0], gpu_png)
    else:
        path = out or runs[0].path.parent / COMPARISON_NAME
        text = comparison_page(runs)
    rec.write_text_atomic(path, text)
    return path
