"""The README's headline table, recomputed from the curated stores' records, matches the README and the
two-H200 results page; the manifest lists every curated file and only files that exist."""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STORES = ROOT / "docs" / "results" / "stores"

# model label, mode, dlscale store, bare-loop store, registered model, compiled: where each headline row's
# records are (the selection, not the figures)
HEADLINE = [
    ("ResNet-50", "eager", "h200x2-2026-11-22/core-eager.jsonl", "h200x2-2026-11-22/core-eager-bare.jsonl",
     "resnet50", False),
    ("ResNet-50", "compiled", "h200x2-2026-11-28/resnet-compiled-2.jsonl",
     "h200x2-2026-11-28/resnet-compiled-2-bare.jsonl", "resnet50", True),
    ("BERT-base", "eager", "h200x2-2026-11-23/core-eager.jsonl", "h200x2-2026-11-23/core-eager-bare.jsonl",
     "bert-base", False),
    ("BERT-base", "compiled", "h200x2-2026-11-23/core-compiled.jsonl", "h200x2-2026-11-23/core-compiled-bare.jsonl",
     "bert-base", True),
    ("GPT-2 124M", "eager", "h200x2-2026-11-23/core-eager.jsonl", "h200x2-2026-11-23/core-eager-bare.jsonl",
     "gpt2", False),
    ("GPT-2 124M", "compiled", "h200x2-2026-11-23/core-compiled.jsonl",
     "h200x2-2026-11-23/core-compiled-bare.jsonl", "gpt2", True),
]


def _lines(rel: str) -> list[dict]:
    return [json.loads(line) for line in (STORES / rel).read_text().splitlines() if line.strip()]


def _dlscale(rel: str, model: str, compiled: bool, gpus: int) -> dict:
    found = [r for r in _lines(rel) if r.get("kind") == "run" and r.get("status") == "ok"
             and r["config"]["model"] == model and r["config"]["compile"] == compiled
             and r["config"]["nproc_per_node"] == gpus]
    assert len(found) == 1, (rel, model, compiled, gpus)
    return found[0]


def _bare(rel: str, model: str, compiled: bool, gpus: int) -> float:
    """Median of the bare loop's lines (bare_loop.py's own lines, or records the suite driver wrote)."""
    values = [r["samples_per_s"] for r in _lines(rel) if r.get("bench") == "bare_loop" and r["model"] == model
              and bool(r["compile"]) == compiled and r["world"] == gpus]
    values += [r["summary"]["samples_per_s"]["median"] for r in _lines(rel) if r.get("kind") == "run"
               and r["config"]["model"] == model and r["config"]["compile"] == compiled
               and r["config"]["nproc_per_node"] == gpus]
    assert values, (rel, model, compiled, gpus)
    return statistics.median(values)


def headline() -> dict[tuple[str, str], list[str]]:
    """(model, mode) -> the cells the README shows for 1 and 2 GPUs: dlscale, bare loop, MFU."""
    out = {}
    for label, mode, store, bare, model, compiled in HEADLINE:
        cells = []
        for gpus in (1, 2):
            rec = _dlscale(store, model, compiled, gpus)
            cells += [f"{rec['summary']['samples_per_s']['median']:,.1f}", f"{_bare(bare, model, compiled, gpus):,.1f}",
                      f"{100 * rec['summary']['mfu']:.1f} %"]
        out[(label, mode)] = cells
    return out


def _table_rows(text: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 2:
            rows.setdefault((cells[0], cells[1]), cells[2:])
    return rows


def test_readme_headline_is_the_records():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Results"):]
    section = section[:section.index("\n## ", 1)]
    rows = _table_rows(section)
    for key, (d1, b1, m1, d2, b2, m2) in headline().items():
        assert key in rows, key
        got = rows[key]  # 1 H200: dlscale, bare, reference, MFU; 2 H200: the same
        assert [got[0], got[1], got[3], got[4], got[5], got[7]] == [d1, b1, m1, d2, b2, m2], key


def test_results_page_shows_the_headline_figures():
    page = (ROOT / "docs" / "results" / "h200x2.md").read_text()
    for (label, mode), (d1, b1, m1, d2, b2, m2) in headline().items():
        one = [line for line in page.splitlines() if line.startswith(f"| {label} | {mode} | 1 |")]
        two = [line for line in page.splitlines() if line.startswith(f"| {label} | {mode} DDP | 2 |")]
        assert len(one) == 1 and len(two) == 1, (label, mode)
        for line, figures in ((one[0], (d1, b1, m1)), (two[0], (d2, b2, m2))):
            assert all(f in line for f in figures), (label, mode, line)


def test_manifest_lists_exactly_the_curated_files():
    manifest = json.loads((STORES / "manifest.json").read_text())
    on_disk = {p.relative_to(STORES).as_posix() for p in STORES.rglob("*.jsonl")}
    assert set(manifest["files"]) == on_disk
    assert set(manifest["fit"]) <= on_disk
    for rel, entry in manifest["files"].items():
        assert re.match(r"^(h100|h200)(x2)?-\d{4}-\d{2}-\d{2}/", rel), rel
        folder, base = rel.split("/")[0], rel.split("/")[-1]
        for page in entry["pages"]:
            text = (ROOT / "docs" / "results" / page).read_text()
            assert folder in text and (base in text or "/host-floor/" in rel), (rel, page)


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "results").glob("*.md")), ids=lambda p: p.name)
def test_every_store_a_page_links_exists(page):
    for link in re.findall(r"\]\((stores/[^)#]+)\)", page.read_text()):
        assert (page.parent / link).exists(), (page.name, link)


CORE_1GPU = ("h200-2026-12-01/core.jsonl", "h200-2026-12-01/core-bare.jsonl")
CORE_LABELS = {"resnet50": "ResNet-50 b256", "bert-base": "BERT-base b128", "gpt2": "GPT-2 124M b16"}


def test_one_h200_core_table_is_the_records():
    """Each row of the one-H200 core table: dlscale's median, the bare loop's and their ratio."""
    page = (ROOT / "docs" / "results" / "h200.md").read_text()
    section = page[page.index("## The core table on the current code"):]
    rows = _table_rows(section[:section.index("\n## ", 1)])
    store, bare = CORE_1GPU
    for model, label in CORE_LABELS.items():
        for compiled in (False, True):
            got = rows[(label, "compiled" if compiled else "eager")]
            rec = _dlscale(store, model, compiled, 1)
            d, b = rec["summary"]["samples_per_s"]["median"], _bare(bare, model, compiled, 1)
            assert got[:4] == [f"{d:,.1f}", f"{b:,.1f}", f"{d / b:.3f}", f"{100 * rec['summary']['mfu']:.1f} %"], label


PEERS = "h200-2026-12-02"
# row label on the page -> (store, record kind, flavor, activation checkpointing); the selection, not the figures
PEER_ROWS = {  # row -> (store, kind, flavor, checkpointing); an external's flavour is its command's --flavor
    "1B, torchtitan 0.2.2 trainer, b4": ("titan.jsonl", "external", None, None),
    "1B, dlscale, b4": ("titan.jsonl", "run", "1b", "none"),
    "3B, torchtitan 0.2.2 trainer, b4": ("titan-large.jsonl", "external", "3b", None),
    "3B, dlscale, b4 (same call)": ("titan-large.jsonl", "run", "3b", "none"),
    "3B, Hugging Face `LlamaForCausalLM`, b4": ("llama-3b-bare.jsonl", "run", "3b", "none"),
    "3B, dlscale, b4 (same call as Hugging Face)": ("llama-3b.jsonl", "run", "3b", "none"),
    "3B, dlscale, selective checkpointing, b4": ("llama-3b.jsonl", "run", "3b", "selective"),
    "8B, torchtitan 0.2.2 trainer, selective (op), b2": ("titan-large.jsonl", "external", "8b", None),
    "8B, dlscale, selective checkpointing, b2 (same call)": ("titan-large.jsonl", "run", "8b", "selective"),
    "8B, dlscale, selective checkpointing, b2 (with the 3B call)": ("llama-8b.jsonl", "run", "8b", "selective"),
}
# dlscale's row -> the size's fastest peer, whose ratio the table bolds
PEER_OF = {"1B, dlscale, b4": "1B, torchtitan 0.2.2 trainer, b4",
           "3B, dlscale, b4 (same call)": "3B, torchtitan 0.2.2 trainer, b4",
           "8B, dlscale, selective checkpointing, b2 (same call)": "8B, torchtitan 0.2.2 trainer, selective (op), b2"}


def _peer_record(store: str, kind: str, flavor: str | None, ckpt: str | None) -> dict:
    def fits(r):
        if r["kind"] != kind or r["status"] != "ok":
            return False
        if flavor is None:
            return True
        if kind == "external":
            return f"--flavor {flavor} " in r["command"] + " "
        return (r["config"]["flavor"], r["config"]["activation_checkpointing"]) == (flavor, ckpt)

    (rec,) = [r for r in _lines(f"{PEERS}/{store}") if fits(r)]
    return rec


def test_one_h200_llama_peers_table_is_the_records():
    """Each row of the Llama peers table: tokens/s from its record, and dlscale's ratio to the size's fastest peer."""
    page = (ROOT / "docs" / "results" / "h200.md").read_text()
    section = page[page.index("## Llama 1B, 3B and 8B against their peers"):]
    section = section[:section.index("\n## ", 1)]
    table = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in section.splitlines() if line.startswith("| ") and not line.startswith("| case")}
    assert set(table) == set(PEER_ROWS)
    tps = {label: _peer_record(*where)["summary"]["tokens_per_s"] for label, where in PEER_ROWS.items()}
    for label in PEER_ROWS:
        assert table[label][0] == f"{tps[label]:,.0f}", label
    for dl, peer in PEER_OF.items():
        assert table[dl][2] == f"**{tps[dl] / tps[peer]:.3f}**"
    fastest = {peer.split(",")[0]: peer for peer in PEER_OF.values()}  # "3B" -> its torchtitan row
    for label, cells in table.items():
        ratio = tps[label] / tps[fastest[label.split(",")[0]]]
        assert cells[2].strip("*") == ("1" if label in fastest.values() else f"{ratio:.3f}"), label
