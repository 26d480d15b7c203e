"""The reports' jargon, explained once: a "Terms" block under a report's opening lines names every term its
text uses, in the order the text first uses it (report.md, summary.md and the HTML page)."""
from __future__ import annotations

import html
import re

# (how the term shows in a report, what it means); a pattern matches the term where it stands as a word
TERMS: tuple[tuple[str, str, str], ...] = (
    (r"T_mix/T_ft", "T_mix/T_ft",
     "MixNet's iteration time over a non-blocking fat-tree's for the same model and link speed (1.05: 5 % slower)"),
    (r"\bd\*", "d*", "break-even delay: the constant delay per reconfiguration at which T_mix/T_ft reaches the "
                     "claim's limit (from the bound, or from the model where it says so)"),
    (r"\br25\b", "r25", "the authors' own T_mix/T_ft at their 25 ms reconfiguration delay, granted by the bound"),
    (r"T_ft,max", "T_ft,max", "the longest fat-tree iteration the model's FLOPs allow at the assumed MFU: the "
                              "bound's denominator, so the bound stays a lower bound"),
    (r"\bMFU\b", "MFU", "model FLOP utilisation: the share of the GPUs' peak FLOP rate the training reaches"),
    (r"\bk = ", "k, window", "the bound's assumptions: k reconfigurations per iteration that compute cannot hide, "
                             "each hidden behind at most `window` of compute"),
    (r"\bCE\b|cost-efficiency", "CE (cost-efficiency)",
     "(T_ft × Cost_ft) / (E[T_mix] × Cost_mix): training throughput per unit of network cost, relative to the "
     "fat-tree (1.2: 20 % better)"),
    (r"α", "α", "OCS ports (NICs) per server on the regional optical switch"),
    (r"grid point", "grid point", "one set of modelling assumptions (GPU, skew, MFU, overlap, greedy, α) of the "
                                  "robustness grid; the baseline is the first"),
    (r"scorecard|model verdict", "scorecard, model verdict",
     "the model carries a verdict only for a model whose error on the authors' held-out published figures beats "
     "the trivial predictor \"MixNet = fat-tree\""),
    (r"calibrated", "calibrated", "the model at the paper's 25 ms reproduces both the authors' T_mix/T_ft (within "
                                  "tolerance) and a cost-efficiency inside the paper's range (reported only; the "
                                  "scorecard decides where the model speaks)"),
    (r"busBW", "busBW", "nccl-tests' bus bandwidth: algBW × (n − 1)/n for all-to-all, comparable with the link rate"),
    (r"p99 ≥", "p99 ≥", "a one-sided 95 % lower bound on the p99: a two-sided interval of a p99 needs more cycles"),
)


def used(text: str) -> list[tuple[str, str]]:
    """(term, meaning) for every term the text uses, in the order of its first use."""
    found = []
    for pattern, term, meaning in TERMS:
        m = re.search(pattern, text)
        if m:
            found.append((m.start(), term, meaning))
    return [(term, meaning) for _, term, meaning in sorted(found)]


def markdown(text: str) -> list[str]:
    terms = used(text)
    if not terms:
        return []
    return ["**Terms.** " + "; ".join(f"*{term}*: {meaning}" for term, meaning in terms) + ".", ""]


def html_block(text: str) -> str:
    terms = used(text)
    if not terms:
        return ""
    return ('<details class="terms" open><summary>Terms</summary><dl>' +
            "".join(f"<dt>{html.escape(t)}</dt><dd>{html.escape(m)}</dd>" for t, m in terms) + "</dl></details>")
