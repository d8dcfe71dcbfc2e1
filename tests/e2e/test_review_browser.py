"""``bulkinfer review`` in a real headless Chromium (Debian's, driven by Playwright): a reviewer
approves one row and rejects another with the keyboard, reloads and sees both; a second
reviewer (another browser context, another key) gets another row and cannot decide one the
first holds (a 409 naming her); the decisions table holds exactly those two; the page asks
for nothing outside the server."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from bulkinfer import load_config, run_job

from ensemble_job import REVIEW, job
from helpers import ARTIFACTS, Server, chromium, cli

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"


def test_two_reviewers_work_the_queue_with_the_keyboard(tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    job(tmp_path, monkeypatch)
    run_job(load_config(tmp_path / "job.toml"))
    (tmp_path / "keys.txt").write_text(f"{ALICE} id=alice\n{BOB} id=bob\n")
    server = Server(["out", "--api-keys-file", "keys.txt"], tmp_path, wait_ready=False, command="review")
    requests: list[str] = []
    console: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            alice = open_as(browser, server.url, ALICE, requests, console)
            first = current(alice)
            alice.keyboard.press("a")
            second = next_row(alice, first)
            alice.fill("#note", "spam, twice")
            alice.keyboard.press("Escape")  # out of the note: the keys decide again
            alice.keyboard.press("r")
            third = next_row(alice, second)
            bob = open_as(browser, server.url, BOB, requests, console)
            assert current(bob) not in (first, second, third)  # alice holds third: bob got another
            refused = bob.evaluate("""async (id) => {
                const r = await fetch('/api/decide', {method: 'POST', headers: {'Authorization': 'Bearer ' + sessionStorage.getItem('reviewer')},
                                                       body: JSON.stringify({id: id, verdict: 'approve'})});
                return [r.status, (await r.json()).error.message];
            }""", third)  # fmt: skip
            assert refused[0] == 409 and f"row '{third}' is held by alice" in refused[1]
            alice.reload()
            alice.wait_for_selector(f"#queue tr[data-id='{second}'].reject")
            verdicts = alice.evaluate("() => Object.fromEntries([...document.querySelectorAll('#queue tr')]"
                                      ".map(tr => [tr.dataset.id, tr.className]))")  # fmt: skip
            assert {k: v for k, v in verdicts.items() if v} == {first: "approve", second: "reject"}
            assert set(verdicts) == {str(i) for i in REVIEW}
            rule = alice.text_content("#row-rule")  # 7 and 32 failed in words: no rule held, on_error sent them
            assert rule == ("review: decision.on_error (a model failed on the row, no rule held)" if current(alice)
                            in ("7", "32") else "review: any(words.tokens[word == 'bad']) or longest.longest > 8")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            alice.screenshot(path=str(ARTIFACTS / "review-page.png"), full_page=True)
            browser.close()
    finally:
        server.stop()
    decisions = pq.read_table(tmp_path / "review" / "_review" / "decisions.parquet").to_pylist()
    assert [(d["id"], d["verdict"], d["reviewer"], d["note"]) for d in decisions] == [
        (first, "approve", "alice", ""), (second, "reject", "alice", "spam, twice")
    ]  # fmt: skip
    summary = json.loads(cli("review", "out", "--summary", "--json", cwd=tmp_path, check=True).stdout)
    rules = summary["rules"]
    assert summary["rows"] == len(REVIEW) and summary["decided"] == 2
    assert sum(r["rows"] for r in rules.values()) == len(REVIEW)
    reviewed = {k: (r["approved"], r["rejected"]) for k, r in rules.items() if r["approved"] or r["rejected"]}
    assert sum(a for a, _ in reviewed.values()) == 1 and sum(r for _, r in reviewed.values()) == 1
    assert all(r["precision"] == (r["rejected"] / (r["approved"] + r["rejected"])) for r in rules.values()
               if r["precision"] is not None)  # fmt: skip
    assert console == ["error: Failed to load resource: the server responded with a status of 409 (Conflict)"]  # bob's
    assert all(u.startswith(server.url) or u.startswith("blob:") for u in requests), requests


def open_as(browser, url: str, key: str, requests: list[str], console: list[str]):
    page = browser.new_context().new_page()
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.goto(url)
    page.fill("#who-value", key)
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.getElementById('row-id').textContent !== ''")
    return page


def current(page) -> str:
    return str(page.text_content("#row-id"))


def next_row(page, previous: str) -> str:
    page.wait_for_function(f"() => document.getElementById('row-id').textContent !== '{previous}'")
    return current(page)
