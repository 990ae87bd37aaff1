"""Claim: the inspector's HTML report works in a real browser, offline: headless Chromium (the
system's, driven by Playwright) opens it with no console error and no network request, shows one
row per collective, sorts a table by bytes when its header is clicked, and counts the
differences between twins. Skips, saying why, where no browser can be had."""

import os
import shutil

import pytest

from parity_tests.helpers import inspect_collectives
from shard_parity.inspector.html import write_html

CHROMIUM_ARGS = [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run',
]  # fmt: skip


def chromium():
    """(sync_playwright, path of the system Chromium), or skip saying what is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip('no browser: Playwright for Python is not installed (pip install playwright)')
    path = shutil.which('chromium') or shutil.which('chromium-browser')
    if path is None:
        pytest.skip('no browser: the system Chromium is not installed (apt-get install chromium)')
    return sync_playwright, path


def bytes_column(page, program):
    cells = f'table[data-program="{program}"] tbody tr td:nth-child(3)'
    return [int(x) for x in page.eval_on_selector_all(cells, 'cs => cs.map(c => c.dataset.sort)')]


@pytest.mark.slow
def test_report_opens_sorts_and_counts_in_chromium(tmp_path):
    sync_playwright, path = chromium()
    r = inspect_collectives('mlp', 'fsdp')
    html = write_html(r, str(tmp_path / 'report.html'))
    errors, requests = [], []
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        except Exception as e:  # noqa: BLE001  a browser that cannot start is no browser
            pytest.skip(f'no browser: {path} does not start here ({str(e)[:200]})')
        page = browser.new_page(viewport={'width': 1600, 'height': 1000})
        page.on('console', lambda m: errors.append(m.text) if m.type == 'error' else None)
        page.on('pageerror', lambda e: errors.append(str(e)))
        page.on('request', lambda q: None if q.url.startswith('file:') else requests.append(q.url))
        page.goto('file://' + html)
        for program, ops in r['programs'].items():
            assert page.locator(f'table[data-program="{program}"] tr.op').count() == len(ops)
        before = bytes_column(page, 'auto')
        assert before != sorted(before, reverse=True)  # so that sorting has something to do
        page.click('table[data-program="auto"] th:has-text("bytes")')
        assert bytes_column(page, 'auto') == sorted(before, reverse=True)
        page.click('table[data-program="auto"] th:has-text("bytes")')
        assert bytes_column(page, 'auto') == sorted(before)
        shown = int(page.inner_text('#difference-count'))
        assert shown == len(r['difference_lines']) > 0
        assert page.locator('#differences li').count() == shown
        assert page.locator('table[data-program="auto"] tr.diff').count() > 0
        page.screenshot(path=str(tmp_path / 'report.png'), full_page=False)
        browser.close()
    assert errors == [] and requests == []
    assert os.path.getsize(tmp_path / 'report.png') > 10_000
