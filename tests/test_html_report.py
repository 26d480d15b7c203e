"""`harness report RUN_DIR... --html`: one self-contained page built from a real (small) falsification run,
its numbers taken from the run's record, and loaded in a real headless Chromium: no console error, no
fetch (the page's Content-Security-Policy would turn any into a console error), a screenshot that shows
figures. The browser part skips, with the reason, where no Chromium is installed."""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.cli import main
from harness.html_report import html_page

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module")
def run_dir(falsify_run) -> Path:
    return falsify_run[0]


def test_page_is_self_contained_and_carries_the_records_numbers(run_dir):
    text = (run_dir / "report.html").read_text()
    assert "<script" not in text and "<link" not in text and "url(" not in text
    sources = [s for s in re.findall(r'\b(?:src|href)="([^"]*)"', text) if not s.startswith("#")]  # in-page links
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    for src in sources:   # every inline figure is a real PNG
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(sources) == 5  # verdict plot, stage CDFs, cycle timeline, accuracy vs truth, GPU view
    assert (run_dir / "gpu_view.png").read_bytes() == base64.b64decode(sources[4].split(",", 1)[1])
    verdict = json.loads((run_dir / "verdict.json").read_text())
    from harness.steps.mixnet import claim_label, evidence_words

    for claim in verdict["claims"]:
        row = text[text.index(f"<code>{claim['id']}</code>"):]
        label = claim_label(claim, evidence_words(verdict["provenance"]))
        assert row.split("</tr>")[0].count(f"<b>{label}</b>") == 1
    late = verdict["lateness"]   # the cycles whose delays the emulator realised late are named on the page too
    assert (f"realised delays late in {len(late['cycles'])} cycle(s)" if late["cycles"]
            else "realised the delays of every measured cycle as drawn") in text
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    for r in summary["accuracy"]:
        assert f"<td>{r['stage']}</td><td class=\"num\">{r['n']}</td>" in text
    lost = summary["lost_events"]  # the true events of watched cycles without a recorded one: none here
    assert lost["true"] > 0 and f"<p>Of {lost['true']} true stage events while their cycles were watched, 0 in ok" in text
    turnaround = summary["delays_ms"]["turnaround"]
    assert f'<td class="num">{turnaround["mean"]:.3f}</td>' in text
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["playbook"]["sha256"] in text
    identity = text[text.index("<h3>Device identity</h3>"):]
    assert f"<td>ocs</td><td>ocs1</td><td><code>{manifest['extra']['devices']['ocs']['ocs1']}</code>" in identity
    gpu = manifest["extra"]["devices"]["hosts"]["gpu1"]["gpus"][0]
    assert f"<td><code>{gpu['name']}</code></td><td><code>{gpu['uuid']}</code></td>" in identity  # a row per GPU


def test_page_has_a_table_of_contents_and_no_python_reprs(run_dir):
    """Every section is reachable from the contents; recorded values are rendered as tables and text, never
    as Python reprs (a dict or a list of dicts pasted as a string)."""
    text = (run_dir / "report.html").read_text()
    toc = re.search(r'<nav class="toc">(.*?)</nav>', text, re.S)
    assert toc, "no table of contents"
    links = re.findall(r'<a href="#([^"]+)">', toc.group(1))
    headings = re.findall(r'<h2 id="([^"]+)">', text)
    assert links == headings and {"verdict", "stage-delays", "provenance"} <= set(links)
    for repr_mark in ("{'", "[{", "None<", ">None", "&#x27;:"):
        assert repr_mark not in text, repr_mark


def test_every_output_opens_with_the_same_sentence_per_claim_and_explains_its_terms(run_dir):
    """report.md, summary.md, the console (its log) and the HTML page give each claim the same causal sentence
    before anything else of the verdict; the terms those sentences use are explained where they first appear."""
    import html

    sentences = json.loads((run_dir / "summary.json").read_text())["summary"]["results"]["verdict"]["claims"]
    assert len(sentences) == len(json.loads((run_dir / "verdict.json").read_text())["claims"])
    report, summary = (run_dir / "report.md").read_text(), (run_dir / "summary.md").read_text()
    page = html.unescape((run_dir / "report.html").read_text())
    console = (run_dir / "console.log").read_text()
    for text in (report, summary):
        opening = text[:text.index("\n## ")]  # before the first section
        assert [f"- **{x}**" for x in sentences] == [line for line in opening.splitlines() if line.startswith("- **")]
        assert opening.index(sentences[-1]) < opening.index("**Terms.**") and "*d**: break-even delay" in opening
    assert all(f"<li><b>{x}</b></li>" in page for x in sentences)
    assert page.index(sentences[-1]) < page.index("<summary>Terms</summary>") < page.index("<h3>By scenario</h3>")
    assert all(" ".join(x.split()) in " ".join(console.split()) for x in sentences)  # the console wraps lines


def test_claims_table_gives_each_reason_once(run_dir):
    from harness.steps.mixnet import claims_markdown

    verdict = json.loads((run_dir / "verdict.json").read_text())
    lines = claims_markdown(verdict)
    reasons = {cell["reason"] for c in verdict["claims"] for cell in c["by_scenario"].values()}
    text = "\n".join(lines)
    assert reasons and all(text.count(r) == 1 for r in reasons)
    assert text.count(verdict["bound"]["assumptions_text"]) == 1


def test_comparison_of_two_runs_names_both(run_dir, tmp_path):
    other = tmp_path / "other-run"
    shutil.copytree(run_dir, other)
    out = tmp_path / "cmp.html"
    assert main(["report", str(run_dir), str(other), "--html", "--out", str(out)]) == 0
    text = out.read_text()
    assert "Differences against the first run" in text and text.index("Differences against") < text.index("per-stage CDFs")
    assert "Comparison of 2 runs" in text and f">{run_dir.name}</h2>" in text and ">other-run</h2>" in text


def test_two_runs_are_compared_by_their_differences_per_cycle(run_dir, tmp_path, capsys):
    """The oracle: a copy of the run whose first packets all came 5 ms later differs by exactly +5 ms in
    first_packet and turnaround (interval around it), and by nothing in the stages before."""
    import pandas as pd

    later = tmp_path / "later"
    shutil.copytree(run_dir, later)
    events = pd.read_parquet(later / "events.parquet")
    events.loc[events["stage"] == "first_packet", "t_ns"] += 5_000_000
    events.to_parquet(later / "events.parquet", index=False)
    from harness.html_report import difference_rows, load_run

    rows = {r["stage"]: r for r in difference_rows([load_run(run_dir), load_run(later)])}
    for stage in ("first_packet", "turnaround"):
        r = rows[stage]
        assert abs(r["difference_ms"] - 5.0) < 1e-6 and r["cycles_A"] == r["cycles_B"] == 2
        assert r["difference_ci"] is None  # 2 cycles a side: too few for an interval that holds its level
    assert rows["phy_up"]["difference_ms"] == 0 and rows["phy_up"]["ratio"] == 1
    assert main(["report", str(run_dir), str(later)]) == 0
    out = capsys.readouterr().out
    assert "| first packet | run | later |" in out and "| 5.000 (an interval needs ≥ 10 cycles) |" in out
    assert main(["report", str(run_dir), str(later), "--recompute"]) == 2


def browser() -> str:
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium installed (.ci/run installs Debian's `chromium`; apt-get install -y chromium)")


def load_in_browser(html: Path, shot: Path) -> list[str]:
    """Open the page in headless Chromium, screenshot it; the console messages it logged."""
    proc = subprocess.run(
        [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-logging=stderr",
         "--v=0", f"--user-data-dir={shot.parent / 'profile'}", "--virtual-time-budget=5000",
         "--window-size=1280,2400", f"--screenshot={shot}", html.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.exists(), proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def test_page_opens_in_headless_chromium_without_console_errors(run_dir, tmp_path):
    html = run_dir / "report.html"
    shot = tmp_path / "report.png"
    assert load_in_browser(html, shot) == []   # the page has no script: any console line is an error
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1280)
    # Figures were decoded and painted: far more distinct colours than text on white gives.
    assert len({tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}) > 200
    # The same browser does report a fetch: the page's policy refuses it and says so on the console.
    bad = tmp_path / "bad.html"
    bad.write_text(html_page("bad", ['<img src="http://127.0.0.1:9/x.png">']))
    assert any("Content Security Policy" in line for line in load_in_browser(bad, tmp_path / "bad.png"))
