"""Where a run's delays come from, and the words a verdict on them may use (words follow provenance):
measured on a bench → falsified / holds; emulated from a profile that copies a paper's figures → (in)consistent
with the paper's own figures; emulated from the emulator's own model → (in)consistent with the emulator's
model. Every verdict step and the reports use these, so the rule is written once."""
from __future__ import annotations


def provenance(manifest: dict) -> dict:
    """Where the delays come from, from the run's manifest: an emulated profile, or a real bench."""
    profile = manifest.get("profile")
    bench = (manifest.get("extra") or {}).get("bench") or (manifest.get("playbook") or {}).get("bench")
    if profile:
        copies = profile.get("copies")
        return {"emulated": True, "bench": bench, "profile": profile.get("name"),
                "profile_source": (profile.get("source") or "").strip(), "copies_published_figures": copies,
                "delays": f"emulated from profile {profile.get('name')}" +
                          (f" (copies published figures: {copies})" if copies else "")}
    return {"emulated": False, "bench": bench, "profile": None, "copies_published_figures": None,
            "delays": f"measured on bench {bench}"}


def evidence_words(prov: dict) -> dict[str, str]:
    """What a verdict may be called given where its delays come from: measured on a bench → falsified / holds;
    emulated from a profile copying the paper's figures → (in)consistent with the paper's own measured figures;
    emulated from the emulator's own model → (in)consistent with the emulator's model."""
    if not prov.get("emulated"):
        return {"falsified": "falsified", "holds": "holds"}
    if prov.get("copies_published_figures"):
        return {"falsified": "inconsistent with the paper's own measured figures",
                "holds": "consistent with the paper's own measured figures"}
    return {"falsified": "inconsistent with the emulator's model", "holds": "consistent with the emulator's model"}
