"""The docs tier's browser check (.ci/_docs_browser.py) on a tiny hand-made site.

The site has three pages with Material's layout classes, a search box that reads the
search index as Material's does (the same elements), and an external stylesheet (which
must be blocked, not fetched). Each test breaks one thing and the check must fail,
naming the page. They need playwright and a Chromium (``/usr/bin/chromium`` or
``FP16UTILS_CHROMIUM``): the docs tier (.ci/docs) has both and runs this file; elsewhere
they are skipped, saying which is missing. The helpers that need no browser are tested
everywhere.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from importlib.util import find_spec, module_from_spec, spec_from_file_location
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / '.ci' / '_docs_browser.py'
CHROMIUM = os.environ.get('FP16UTILS_CHROMIUM', '/usr/bin/chromium')


def _load_checker():
    spec = spec_from_file_location('_docs_browser', CHECKER)
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def _no_browser() -> str:
    if find_spec('playwright') is None:
        return 'playwright is not installed here (the docs tier, .ci/docs, has it)'
    if not os.access(CHROMIUM, os.X_OK):
        return f'no Chromium at {CHROMIUM} (set FP16UTILS_CHROMIUM)'
    return ''


browser = pytest.mark.skipif(bool(_no_browser()), reason=_no_browser())

STYLE = ('body{margin:0;font:16px sans-serif;color:#222}'
         'header.md-header{position:sticky;top:0;height:48px;background:#3f51b5;color:#fff}'
         'nav.md-nav--primary{float:left;width:200px;padding:8px}'
         '.md-content{margin-left:230px}h1{font-size:40px}')
SEARCH_JS = """
document.addEventListener('DOMContentLoaded', () => {
  const box = document.querySelector('.md-search__input');
  const meta = document.querySelector('.md-search-result__meta');
  const list = document.querySelector('.md-search-result__list');
  box.addEventListener('keyup', async () => {
    const index = await (await fetch('/search/search_index.json')).json();
    const q = box.value.toLowerCase();
    const hits = index.docs.filter((d) => (d.title + ' ' + d.text).toLowerCase().includes(q));
    list.innerHTML = hits.map((d) =>
      `<li><a class="md-search-result__link" href="/${d.location}">${d.title}</a></li>`).join('');
    meta.textContent = hits.length ? `${hits.length} matching documents` : 'No matching documents';
  });
});
"""
NAV = '<a href="/">Home</a> <a href="/guide/">Guide</a> <a href="/api/">API</a>'


def _page(title: str, body: str, nav: str = NAV, head: str = '') -> str:
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>'
            f'<style>{STYLE}</style>{head}<script src="/assets/search.js"></script></head>'
            '<body><header class="md-header">fp16utils <input class="md-search__input">'
            '<span class="md-search-result__meta">Type to start searching</span>'
            '<ol class="md-search-result__list"></ol></header>'
            f'<nav class="md-nav md-nav--primary">{nav}</nav>'
            f'<div class="md-content"><article><h1 id="top-title">{title}</h1>{body}'
            '</article></div></body></html>')


PAGES = {
    'index.html': ('Home', '<p>Start with the <a href="guide/#setup">setup</a>.</p>'),
    'guide/index.html': ('Guide', '<h2 id="setup">Setup</h2><p>The loss scaler skips a '
                                  'step on overflow. <a href="../api/">API</a></p>'),
    'api/index.html': ('API', '<p>LossScaler reference. <a href="#top-title">up</a></p>'),
}


def _site(tmp_path: Path, edit=None) -> Path:
    """The good site under tmp_path/site (``edit(pages)`` changes it first)."""
    site = tmp_path / 'site'
    pages = {name: _page(*spec) for name, spec in PAGES.items()}
    pages['index.html'] = _page(*PAGES['index.html'], head=(
        '<link rel="stylesheet" href="https://fonts.example.invalid/roboto.css">'))
    index = [{'location': name[:-len('index.html')], 'title': title,
              'text': body} for name, (title, body) in PAGES.items()]
    if edit is not None:
        edit(pages, index)
    for name, html in pages.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(html, encoding='utf-8')
    (site / 'assets').mkdir()
    (site / 'assets' / 'search.js').write_text(SEARCH_JS)
    (site / 'search').mkdir()
    (site / 'search' / 'search_index.json').write_text(json.dumps({'docs': index}))
    (site / '404.html').write_text('<h1>not found</h1>')
    docs = tmp_path / 'docs'
    (docs / 'api').mkdir(parents=True)
    (docs / 'index.md').write_text('# Home\n\nStart here.\n')
    (docs / 'api' / 'index.md').write_text('---\ntitle: x\n---\n# `API`\n')
    return site


def _check(tmp_path: Path, edit=None, *args: str) -> subprocess.CompletedProcess:
    site = _site(tmp_path, edit)
    result = subprocess.run(
        [sys.executable, str(CHECKER), '--site', str(site), '--chromium', CHROMIUM,
         '--out', str(tmp_path / 'shots'), '--docs', str(tmp_path / 'docs'),
         '--query', 'loss scaler', '--shot', '/', '--shot', 'api/', *args],
        capture_output=True, text=True, timeout=300)
    return result


def _problems(result) -> list:
    return [line.split('problem: ', 1)[1] for line in result.stdout.splitlines()
            if line.startswith('docs-browser: problem: ')]


@browser
def test_a_good_site_passes_with_its_screenshots(tmp_path):
    result = _check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert 'pages checked: 3 ' in out and out.rstrip().endswith('docs-browser: ok')
    # 3 pages x 3 nav links + 1 + 1 + 1 in the bodies.
    assert 'internal links checked: 12 ' in out
    assert 'search "loss scaler": 1 results, first /guide/' in out
    # The stylesheet of another host was asked for, blocked, and is no problem.
    assert 'external requests blocked: 1 (fonts.example.invalid)' in out
    for name, heading in (('home', 'Home'), ('api', 'API')):
        data = (tmp_path / 'shots' / f'{name}.png').read_bytes()
        assert data[:8] == b'\x89PNG\r\n\x1a\n'
        assert struct.unpack('>II', data[16:24]) == (1280, 800)
        assert f'shots/{name}.png (1280x800, ' in out and f'heading "{heading}"' in out


def _link(page: str, html: str):
    def edit(pages, index):
        pages[page] = pages[page].replace('</article>', html + '</article>')
    return edit


def _drop(page: str, old: str, new: str = ''):
    def edit(pages, index):
        assert old in pages[page]
        pages[page] = pages[page].replace(old, new)
    return edit


def _no_such_result(pages, index):
    index.append({'location': 'gone/#x', 'title': 'Gone', 'text': 'loss scaler'})


def _orphan(pages, index):
    pages['extra/index.html'] = _page('Extra', '<p>nobody links here</p>')


@browser
@pytest.mark.parametrize('edit, expected', [
    (_link('guide/index.html', '<a href="../missing/">gone</a>'),
     '/guide/: broken link http://127.0.0.1:PORT/missing/: HTTP 404'),
    (_link('api/index.html', '<a href="../guide/#nowhere">x</a>'),
     '/api/: link http://127.0.0.1:PORT/guide/#nowhere: no element with id "nowhere" on '
     '/guide/'),
    (_link('guide/index.html', '<script>window.undefinedThing.boom()</script>'),
     '/guide/: uncaught JavaScript exception: '),
    (_link('api/index.html', '<script>console.error("the widget broke")</script>'),
     '/api/: console error: the widget broke'),
    (_link('api/index.html', '<img src="/assets/missing.png">'),
     '/api/: http://127.0.0.1:PORT/assets/missing.png answered 404'),
    (_drop('guide/index.html', '<h1 id="top-title">Guide</h1>'),
     '/guide/: no visible <h1> with text in the content'),
    (_drop('guide/index.html', 'class="md-nav md-nav--primary"'),
     '/guide/: the navigation (nav.md-nav--primary) is not shown'),
    (_drop('index.html', '</style>', 'header.md-header{position:static}</style>'),
     '/: the styled Material header is not shown'),
    (_no_such_result, '/ (search "loss scaler"): result http://127.0.0.1:PORT/gone/#x is '
                      'not a page of the site'),
    (_orphan, '/extra/: no link leads to it from the other pages'),
], ids=['broken-link', 'missing-anchor', 'js-error', 'console-error', 'missing-asset',
        'no-h1', 'no-nav', 'unstyled', 'search-result', 'orphan'])
def test_each_defect_fails_the_check_naming_its_page(edit, expected, tmp_path):
    result = _check(tmp_path, edit)
    assert result.returncode == 1, result.stdout + result.stderr
    port = result.stdout.split('at http://127.0.0.1:')[1].split()[0]
    problems = _problems(result)
    want = expected.replace('PORT', port)
    assert any(p.startswith(want) for p in problems), problems
    assert f'docs-browser: FAILED: {len(problems)} problems' in result.stdout


@browser
def test_a_search_that_finds_nothing_the_index_holds_fails(tmp_path):
    def deaf(pages, index):  # the search box never answers
        for name in pages:
            pages[name] = pages[name].replace('<script src="/assets/search.js"></script>', '')
    result = _check(tmp_path, deaf, '--search-wait', '2')
    assert result.returncode == 1
    assert any(p.startswith('/ (search "loss scaler"): the search said nothing in 2 s')
               for p in _problems(result)), result.stdout
    assert 'no search query found anything' in result.stdout


@browser
def test_a_screenshot_without_the_expected_heading_fails(tmp_path):
    result = _check(tmp_path, None, '--shot', 'guide/=Getting started')
    assert result.returncode == 1
    problems = _problems(result)
    assert len(problems) == 1, problems
    assert problems[0].startswith('/guide/: screenshot ')
    assert 'does not show the heading "Getting started" (its <h1> is \'Guide\', in view)' \
        in problems[0]


@browser
def test_a_heading_out_of_view_fails_the_screenshot(tmp_path):
    result = _check(tmp_path, _drop('api/index.html', '<h1 ', '<div style="height:2000px">'
                                    '</div><h1 '))
    assert result.returncode == 1
    assert any(p.startswith('/api/: screenshot ') and "its <h1> is 'API', out of view" in p
               for p in _problems(result)), result.stdout


@pytest.mark.skipif(find_spec('playwright') is None, reason=_no_browser() or 'no playwright')
def test_a_chromium_that_does_not_start_is_reported(tmp_path):
    site = _site(tmp_path)
    result = subprocess.run([sys.executable, str(CHECKER), '--site', str(site), '--chromium',
                             str(tmp_path / 'no-chromium')],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f'Chromium at {tmp_path / "no-chromium"} does not start' in result.stdout


def test_the_expected_heading_comes_from_the_markdown_without_markup(tmp_path):
    docs = tmp_path
    (docs / 'reference' / 'api').mkdir(parents=True)
    (docs / 'reference' / 'api' / 'loss-scaling.md').write_text(
        '---\ntitle: Scaling\n---\nText first.\n\n## Not this\n# The `LossScaler` '
        '[class](x.md) {#scaler}\n# Second\n')
    (docs / 'index.md').write_text('#Not a heading\n# *fp16utils* #\n')
    assert checker.expected_heading(docs, '/reference/api/loss-scaling/') == \
        'The LossScaler class'
    assert checker.expected_heading(docs, '/') == 'fp16utils'
    assert checker.expected_heading(docs, '/missing/') is None


def test_the_pages_of_a_site_and_the_page_a_link_shows(tmp_path):
    for name in ('index.html', '404.html', 'a/index.html', 'a/b/index.html', 'x.html'):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('')
    pages = checker.site_pages(tmp_path)
    assert pages == ['/', '/a/', '/a/b/', '/x.html']
    known = set(pages)
    assert checker.page_key('/a/b', known) == '/a/b/'
    assert checker.page_key('/a/index.html', known) == '/a/'
    assert checker.page_key('/index.html', known) == '/'
    assert checker.page_key('/c', known) == '/c'  # not a page: stays as it is


def test_only_a_png_header_gives_a_size():
    header = b'\x89PNG\r\n\x1a\n' + b'\x00\x00\x00\rIHDR' + struct.pack('>II', 1280, 800)
    assert checker.png_size(header + b'\x08\x02') == (1280, 800)
    assert checker.png_size(b'GIF89a' + header[6:]) is None


def test_bad_arguments_are_refused_before_a_browser_starts(tmp_path):
    site = _site(tmp_path)
    run = [sys.executable, str(CHECKER), '--site']
    result = subprocess.run(run + [str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and 'holds no index.html: not a built site' in result.stdout
    result = subprocess.run(run + [str(site), '--shot', 'guide/'], capture_output=True,
                            text=True)
    assert result.returncode == 2
    assert 'no heading to expect on /guide/: give --shot /guide/=HEADING' in result.stdout
    result = subprocess.run(run + [str(site), '--shot', 'guide/=Guide'], capture_output=True,
                            text=True)
    assert result.returncode == 2 and '--shot needs --out' in result.stdout
