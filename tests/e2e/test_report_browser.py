"""``bulkinfer report`` opened in a real headless Chromium (Debian's, driven by Playwright):
no console error, no request at all (the page is self-contained), every chart drawn with
content, and a screenshot kept under ``test-artifacts/`` for a person to look at."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from bulkinfer import load_config, run_job

from helpers import ARTIFACTS, chromium, cli, tabular_table, train_classifier, write


def open_page(page_file: Path, shot: Path) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        console, requests, failed = [], [], []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        page.on("request", lambda r: requests.append(r.url))
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.goto(page_file.as_uri(), wait_until="load")
        charts = page.evaluate("""() => [...document.querySelectorAll('svg.chart')].map(s => {
            const r = s.getBoundingClientRect();
            return {label: s.getAttribute('aria-label'), w: r.width, h: r.height,
                    marks: s.querySelectorAll('path, rect, polyline, use').length,
                    text: s.textContent.length};
        })""")
        sections = page.evaluate("() => [...document.querySelectorAll('section h2')].map(h => h.textContent)")
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    return {"console": console, "requests": requests, "failed": failed, "charts": charts, "sections": sections}


def test_report_page_in_a_real_browser(tmp_path):
    chromium()
    model = train_classifier(tmp_path / "m.joblib")
    t = tabular_table(2000, seed=6)
    write(t, tmp_path / "in.parquet")
    shifted = t.set_column(1, "x1", [pa.compute.add(t["x1"], 1.5)])
    write(shifted, tmp_path / "new.parquet")
    base = {"model.name": str(model), "source.id_column": "id", "source.shard_rows": 250,
            "execution.progress": "none", "cost.instance_price_per_hour": 0.17}  # fmt: skip
    run_job(load_config(overrides={**base, "source.paths": [str(tmp_path / "in.parquet")],
                                   "sink.path": str(tmp_path / "old")}))  # fmt: skip
    run_job(
        load_config(
            overrides={
                **base,
                "source.paths": [str(tmp_path / "new.parquet")],
                "sink.path": str(tmp_path / "new"),
                "monitor.baseline": str(tmp_path / "old"),
            }
        )
    )

    proc = cli("report", str(tmp_path / "new"), "--compare", str(tmp_path / "old"), "-o", str(tmp_path / "r.html"),
               check=True)  # fmt: skip
    assert str(tmp_path / "r.html") in proc.stdout
    seen = open_page(tmp_path / "r.html", ARTIFACTS / "report.png")
    assert seen["console"] == [] and seen["failed"] == []
    assert seen["requests"] == [(tmp_path / "r.html").as_uri()]  # the page itself, nothing else
    assert seen["sections"] == ["Summary", "Throughput", "Where the time went", "Batches", "Cost", "Errors",
                                "Output statistics", "Drift", "Canary comparison"]  # fmt: skip
    labels = [c["label"] for c in seen["charts"]]
    assert labels == [
        "Throughput over time", "Busy time per stage", "Model calls by batch size (rows)",
        "prediction: share of rows per class", "proba_no: quantiles", "proba_yes: quantiles",
        "PSI against the baseline (dashed: max_psi 0.25)", "prediction: OLD label vs NEW label",
        "proba_no: quantiles, OLD (grey) and NEW (blue)", "proba_yes: quantiles, OLD (grey) and NEW (blue)",
    ]  # fmt: skip
    for c in seen["charts"]:
        assert c["w"] > 300 and c["h"] > 100 and c["marks"] >= 5 and c["text"] > 10, c
    html = (tmp_path / "r.html").read_text()
    assert "<script" not in html and 'href="http' not in html and 'src="' not in html
    report = json.loads((tmp_path / "new" / "_bulkinfer" / "report.json").read_text())
    assert f"{report['rows_out']:,}" in html and report["drift"]["status"] == "drift"
    assert len(report["timeline"]) >= 8  # one point per commit
    (ARTIFACTS / "report.html").write_text(html)


def test_report_of_a_picture_job_shows_thumbnails(tmp_path):
    from pictures import write_bad, write_photos

    chromium()
    write_photos(tmp_path / "photos", 16, scale=0.5)
    bad = write_bad(tmp_path / "photos")
    cli("run", "--input", "photos/*.jpg", "--model", "nudenet", "--output", "out", "--set", "execution.max_errors=5",
        cwd=tmp_path, check=True)  # fmt: skip
    cli("report", "out", "-o", "r.html", cwd=tmp_path, check=True)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto((tmp_path / "r.html").as_uri(), wait_until="load")
        thumbs = page.evaluate("""() => [...document.querySelectorAll('#pictures figure.thumb')].map(f => {
            const img = f.querySelector('img');
            return {caption: f.querySelector('figcaption').textContent,
                    w: img ? img.naturalWidth : 0, h: img ? img.naturalHeight : 0};
        })""")
        page.locator("#pictures").screenshot(path=str(ARTIFACTS / "report-pictures.png"))
        browser.close()
    assert [u for u in requests if not u.startswith("data:")] == [(tmp_path / "r.html").as_uri()]
    shown = [t for t in thumbs if t["w"]]
    assert shown and all(max(t["w"], t["h"]) == 160 for t in shown)  # drawn small, from the job's own files
    face = [t for t in shown if t["caption"].split(":")[0].endswith("astronaut.jpg")]
    assert face, thumbs  # NudeNet's face on the astronaut, among the highest scores
    errors = [t for t in thumbs if not t["w"]]
    assert sorted(t["caption"].split(":")[0] for t in errors) == sorted(bad)  # each bad file, named, not drawn
