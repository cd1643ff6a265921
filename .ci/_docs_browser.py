"""Check a built docs site in headless Chromium: pages, links, search, screenshots.

Run by ``.ci/docs`` with the docs virtualenv's interpreter (stdlib + playwright)::

    _docs_browser.py --site DIR [--chromium PATH] [--out DIR] [--docs DIR]
                     [--query TEXT ...] [--shot PAGE[=HEADING] ...]

The site folder is served on 127.0.0.1 (a free port, Python's http.server) and opened
in the Chromium at ``--chromium`` (driven by playwright, never a browser of its own),
with a fresh profile and background networking off. Requests to any other host are
blocked and listed: the site must work offline.

- Every page (each ``.html`` file of the site but ``404.html``): HTTP 200, no console
  error, no uncaught exception, no internal request answered >= 400, an ``<h1>`` with
  text in the content, the Material layout (header styled, navigation and content
  visible), and a link to it from another page.
- Every internal ``<a href>`` answers 200 and its ``#anchor`` exists on the target.
- ``--query``: typed into the search box of the home page; a query that the search
  index holds must list results, one of them a page that holds it; every result
  links to an existing page and anchor; at least one query must find something.
- ``--shot``: a screenshot of PAGE (``/`` for the home page) in ``--out``: a PNG of the
  viewport's size, not blank, and the page shows HEADING (from the page's markdown
  under ``--docs`` when not given) as its ``<h1>`` inside the viewport.

Exit 0 when all hold; 1 with one line per problem, each naming its page; 2 when the
check cannot run (no Chromium, bad arguments).
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import re
import struct
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
                  '--no-first-run', '--disable-background-networking',
                  '--disable-component-update', '--disable-sync']
LOCAL_HOSTS = {'127.0.0.1', 'localhost'}
#: A screenshot is "not blank" with at least this many colours and this share of
#: pixels that differ from the most common one.
MIN_COLOURS, MIN_INK = 16, 0.01

PAGE_FACTS_JS = """() => {
  const seen = (el) => !!el && el.getClientRects().length > 0 &&
      getComputedStyle(el).visibility !== 'hidden';
  const header = document.querySelector('header.md-header');
  const h1 = document.querySelector('.md-content h1');
  let heading = null, box = null;
  if (h1) {
    const copy = h1.cloneNode(true);
    copy.querySelectorAll('.headerlink').forEach((a) => a.remove());
    heading = copy.textContent.replace(/\\s+/g, ' ').trim();
    const r = h1.getBoundingClientRect();
    box = [r.left, r.top, r.right, r.bottom];
  }
  const style = header ? getComputedStyle(header) : null;
  return {
    heading, box, h1_visible: seen(h1),
    header: seen(header) && ['sticky', 'fixed'].includes(style.position) &&
        style.backgroundColor !== 'rgba(0, 0, 0, 0)',
    nav: seen(document.querySelector('nav.md-nav--primary')),
    content: seen(document.querySelector('.md-content')),
    ids: Array.from(document.querySelectorAll('[id], a[name]'), (e) => e.id || e.name),
    links: Array.from(document.querySelectorAll('a[href]'), (a) => a.href),
    text: document.body ? document.body.innerText : '',
  };
}"""

PIXELS_JS = """async (url) => {
  const img = new Image();
  img.src = url;
  await img.decode();
  const c = document.createElement('canvas');
  c.width = img.naturalWidth;
  c.height = img.naturalHeight;
  const ctx = c.getContext('2d');
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  const counts = new Map();
  for (let i = 0; i < d.length; i += 4) {
    const k = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
    counts.set(k, (counts.get(k) || 0) + 1);
  }
  let most = 0;
  for (const n of counts.values()) most = Math.max(most, n);
  const total = c.width * c.height;
  return {colours: counts.size, ink: (total - most) / total};
}"""

SEARCH_STATE_JS = """() => {
  const meta = document.querySelector('.md-search-result__meta');
  return !!meta && /matching document/i.test(meta.textContent);
}"""


class Problems(list):
    """The problems found, each ``PAGE: what``."""

    def add(self, where: str, what: str) -> None:
        self.append(f'{where or "/"}: {what}')


def serve(site: Path) -> http.server.ThreadingHTTPServer:
    """Serve ``site`` on 127.0.0.1 at a free port, in a daemon thread."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def list_directory(self, path):
            # A folder without index.html is no page (a real host answers 404 too).
            self.send_error(404, 'No index.html in this folder')

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def site_pages(site: Path) -> list:
    """The site's page paths (``/``, ``/a/b/``, ``/x.html``), 404.html apart."""
    pages = []
    for html in sorted(site.rglob('*.html')):
        rel = html.relative_to(site).as_posix()
        if rel == '404.html':
            continue
        pages.append('/' + (rel[:-len('index.html')] if html.name == 'index.html' else rel))
    return sorted(pages)


def page_key(path: str, pages: set) -> str:
    """The page a URL path shows (``/a/b`` and ``/a/b/index.html`` are ``/a/b/``)."""
    path = unquote(path) or '/'
    if path.endswith('/index.html'):
        path = path[:-len('index.html')]
    if path not in pages and path + '/' in pages:
        path += '/'
    return path


def http_status(url: str) -> int:
    """The status a GET of an internal URL answers with (redirects followed)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def expected_heading(docs: Path, page: str) -> str | None:
    """The first ``# heading`` of PAGE's markdown under ``docs``, markup stripped."""
    stem = page.strip('/') or 'index'
    for md in (docs / f'{stem}.md', docs / stem / 'index.md', docs / stem / 'README.md'):
        if md.is_file():
            text = re.sub(r'\A---\n.*?\n---\n', '', md.read_text(encoding='utf-8'), flags=re.S)
            found = re.search(r'^#[ \t]+(.+?)[ \t#]*$', text, re.M)
            if found:
                head = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', found.group(1))
                head = re.sub(r'\s*\{[^}]*\}\s*$', '', head)  # attr_list
                return re.sub(r'[`*_]', '', head).strip()
    return None


def png_size(data: bytes) -> tuple | None:
    """(width, height) from a PNG's header; None when it is not a PNG."""
    if data[:8] != b'\x89PNG\r\n\x1a\n' or data[12:16] != b'IHDR':
        return None
    return struct.unpack('>II', data[16:24])


class Checker:
    """One run over a served site with one browser page."""

    def __init__(self, page, base: str, pages: list, problems: Problems) -> None:
        self.page, self.base, self.problems = page, base, problems
        self.pages = pages
        self.facts: dict = {}      # page -> what PAGE_FACTS_JS saw
        self.status: dict = {}     # internal path -> HTTP status
        self.blocked: set = set()  # external URLs the browser asked for
        self.current = ''
        page.on('console', self._console)
        page.on('pageerror', self._pageerror)
        page.on('response', self._response)
        page.on('requestfailed', self._failed)

    def _pageerror(self, exc) -> None:
        if self.current is not None:
            self.problems.add(self.current, f'uncaught JavaScript exception: {exc}')

    def _console(self, msg) -> None:
        if msg.type != 'error' or self.current is None:
            return
        where = (msg.location or {}).get('url', '')
        if where in self.blocked and msg.text.startswith('Failed to load resource'):
            return
        self.problems.add(self.current, f'console error: {msg.text} ({where})')

    def _internal(self, url: str) -> bool:
        return url.startswith(self.base)

    def _response(self, response) -> None:
        if (self.current is not None and self._internal(response.url)
                and response.status >= 400):
            self.problems.add(self.current, f'{response.url} answered {response.status}')

    def _failed(self, request) -> None:
        # Leaving a page cancels what it still loads (Material's search worker, the
        # favicon): that is the check moving on. A missing file answers 404 instead.
        if request.failure == 'net::ERR_ABORTED':
            return
        if self.current is not None and self._internal(request.url):
            self.problems.add(self.current, f'request for {request.url} failed: '
                                            f'{request.failure}')

    def route(self, route) -> None:
        """Let requests to this machine through; block (and list) any other."""
        url = route.request.url
        if urlsplit(url).hostname in LOCAL_HOSTS or not url.startswith(('http', 'ws')):
            route.continue_()
        else:
            self.blocked.add(url)
            route.abort('blockedbyclient')

    def visit(self, path: str) -> None:
        """Open one page and check it."""
        self.current = path
        try:
            response = self.page.goto(self.base + path, wait_until='load')
        except Exception as exc:  # noqa: BLE001 - a timeout, a crashed browser: reported
            self.status[path] = 0
            self.problems.add(path, f'did not load: {str(exc).splitlines()[0]}')
            return
        status = response.status if response else 0
        self.status[path] = status
        if status != 200:
            self.problems.add(path, f'HTTP {status}, expected 200')
            return
        facts = self.page.evaluate(PAGE_FACTS_JS)
        self.facts[path] = facts
        if not facts['heading'] or not facts['h1_visible']:
            self.problems.add(path, 'no visible <h1> with text in the content')
        for part, what in (('header', 'the styled Material header'),
                           ('nav', 'the navigation (nav.md-nav--primary)'),
                           ('content', 'the content (.md-content)')):
            if not facts[part]:
                self.problems.add(path, f'{what} is not shown: the Material layout did '
                                        'not render')

    def crawl(self) -> None:
        """Visit every page, then check every link of every page."""
        for path in self.pages:
            self.visit(path)
        known = set(self.pages)
        reached = {'/'}
        checked = external = 0
        for path in self.pages:
            for href in self.facts.get(path, {}).get('links', []):
                url, fragment = urldefrag(href)
                if not self._internal(url):
                    external += href.startswith('http')
                    continue
                checked += 1
                target = page_key(urlsplit(url).path, known)
                if target != path:
                    reached.add(target)
                self._check_link(path, href, target, url, unquote(fragment))
        self.links_checked, self.links_external = checked, external
        for path in self.pages:
            if path not in reached:
                self.problems.add(path, 'no link leads to it from the other pages')

    def _check_link(self, path, href, target, url, fragment) -> None:
        status = self.status.get(target)
        if status is None:
            status = self.status[target] = http_status(url)
        if status != 200:
            self.problems.add(path, f'broken link {href}: HTTP {status}')
        elif fragment and fragment.lower() != 'top':
            ids = self.facts.get(target, {}).get('ids')
            if ids is None:
                self.problems.add(path, f'link {href}: #{fragment} on a file that is not '
                                        'a page')
            elif fragment not in ids:
                self.problems.add(path, f'link {href}: no element with id '
                                        f'"{fragment}" on {target}')

    def search(self, queries: list, site: Path, wait: float = 15) -> dict:
        """Type each query into the home page's search; results per query."""
        index_file = site / 'search' / 'search_index.json'
        if not index_file.is_file():
            self.problems.add('/', f'no search index ({index_file} is missing)')
            return {}
        docs = json.loads(index_file.read_text(encoding='utf-8')).get('docs', [])
        found = {}
        for query in queries:
            self.current = f'/ (search "{query}")'
            holders = {page_key('/' + d['location'].split('#')[0], set(self.facts))
                       for d in docs
                       if query.lower() in (d.get('title', '') + ' ' +
                                            re.sub(r'<[^>]+>', ' ', d.get('text', ''))).lower()}
            self.page.goto(self.base + '/', wait_until='load')
            box = self.page.locator('input.md-search__input')
            box.click()
            box.fill(query)
            box.press('End')  # Material reads the query on keyup
            try:
                self.page.wait_for_function(SEARCH_STATE_JS, timeout=wait * 1000)
            except Exception:  # noqa: BLE001 - a timeout is the problem reported
                meta = self.page.locator('.md-search-result__meta').all_inner_texts()
                self.problems.add(self.current, f'the search said nothing in {wait:g} s '
                                                f'(it shows {meta!r})')
                continue
            hrefs = self.page.eval_on_selector_all(
                'a.md-search-result__link', 'els => els.map((a) => a.href)')
            found[query] = hrefs
            pages = set()
            for href in hrefs:
                url, fragment = urldefrag(href)
                target = page_key(urlsplit(url).path, set(self.facts))
                pages.add(target)
                if not self._internal(url) or target not in self.facts:
                    self.problems.add(self.current, f'result {href} is not a page of the site')
                elif fragment and unquote(fragment) not in self.facts[target]['ids']:
                    self.problems.add(self.current, f'result {href}: no element with id '
                                                    f'"{unquote(fragment)}" on {target}')
            if holders and not hrefs:
                self.problems.add(self.current, f'no results, but {sorted(holders)} hold '
                                                f'"{query}"')
            elif holders and not pages & holders:
                self.problems.add(self.current, f'no result is a page that holds "{query}" '
                                                f'({sorted(holders)})')
        if queries and not any(found.values()):
            self.problems.add('/', 'no search query found anything, so the search is not '
                                   'shown to work: give a --query that the pages hold')
        return found

    def shoot(self, path: str, heading: str, out: Path) -> tuple:
        """A screenshot of PATH in OUT, checked; returns its path and pixel facts."""
        self.current = path
        name = path.strip('/').replace('/', '-').removesuffix('.html') or 'home'
        shot = out / f'{name}.png'
        self.page.goto(self.base + path, wait_until='load')
        self.page.evaluate('document.fonts.ready.then(() => null)')
        data = self.page.screenshot(path=str(shot))
        size = self.page.viewport_size
        if png_size(data) != (size['width'], size['height']):
            self.problems.add(path, f'screenshot {shot} is {png_size(data)}, expected a PNG '
                                    f'of {size["width"]}x{size["height"]}')
        facts = self.page.evaluate(PAGE_FACTS_JS)
        pixels = self.page.evaluate(
            PIXELS_JS, 'data:image/png;base64,' + base64.b64encode(data).decode())
        if pixels['colours'] < MIN_COLOURS or pixels['ink'] < MIN_INK:
            self.problems.add(path, f'screenshot {shot} looks blank: {pixels["colours"]} '
                                    f'colours, {pixels["ink"]:.2%} of it not background')
        left, top, right, bottom = facts['box'] or (0, 0, 0, 0)
        in_view = (facts['h1_visible'] and bottom > 0 and top < size['height'] and
                   right > 0 and left < size['width'])
        if facts['heading'] != heading or not in_view:
            self.problems.add(path, f'screenshot {shot} does not show the heading '
                                    f'"{heading}" (its <h1> is {facts["heading"]!r}, '
                                    f'{"in" if in_view else "out of"} view)')
        elif heading not in facts['text']:
            self.problems.add(path, f'the rendered text does not contain "{heading}"')
        return shot, pixels


def main(argv=None) -> int:
    """Check the site; 0 when it passes, 1 with the problems, 2 when it cannot run."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--site', type=Path, required=True)
    parser.add_argument('--chromium', default='/usr/bin/chromium')
    parser.add_argument('--out', type=Path)
    parser.add_argument('--docs', type=Path)
    parser.add_argument('--query', action='append', default=[])
    parser.add_argument('--shot', action='append', default=[])
    parser.add_argument('--size', default='1280x800')
    parser.add_argument('--search-wait', type=float, default=15,
                        help='seconds a query may take to show its results')
    args = parser.parse_args(argv)

    if not (args.site / 'index.html').is_file():
        print(f'docs-browser: {args.site} holds no index.html: not a built site')
        return 2
    shots = []
    for spec in args.shot:
        page, _, heading = spec.partition('=')
        page = '/' + page.strip('/') + ('/' if page.strip('/') and '.' not in page else '')
        heading = heading or (expected_heading(args.docs, page) if args.docs else None)
        if not heading:
            print(f'docs-browser: no heading to expect on {page}: give --shot {page}=HEADING '
                  'or --docs with its markdown')
            return 2
        shots.append((page, heading))
    if shots and not args.out:
        print('docs-browser: --shot needs --out, the folder for the screenshots')
        return 2
    width, height = (int(n) for n in args.size.split('x'))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        print(f'docs-browser: playwright does not import ({exc}): pip install playwright')
        return 2

    started = time.monotonic()
    problems = Problems()
    server = serve(args.site)
    base = f'http://127.0.0.1:{server.server_address[1]}'
    try:
        with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
            try:
                context = pw.chromium.launch_persistent_context(
                    profile, executable_path=args.chromium, headless=True,
                    args=CHROMIUM_FLAGS, viewport={'width': width, 'height': height},
                    device_scale_factor=1, service_workers='block')
            except Exception as exc:  # noqa: BLE001 - any launch failure is reported
                print(f'docs-browser: Chromium at {args.chromium} does not start: '
                      f'{str(exc).splitlines()[0]}')
                return 2
            context.set_default_timeout(30000)
            page = context.pages[0] if context.pages else context.new_page()
            checker = Checker(page, base, site_pages(args.site), problems)
            context.route('**/*', checker.route)
            print(f'docs-browser: Chromium {context.browser.version if context.browser else "?"}'
                  f', {len(checker.pages)} pages at {base}')
            checker.crawl()
            found = checker.search(args.query, args.site, args.search_wait) if args.query else {}
            if shots:
                args.out.mkdir(parents=True, exist_ok=True)
            taken = [(*checker.shoot(p, h, args.out), h) for p, h in shots]
            checker.current = None
            context.close()
    finally:
        server.shutdown()

    print(f'docs-browser: pages checked: {len(checker.facts)} (HTTP 200, no console or '
          'page error, <h1>, Material layout)')
    print(f'docs-browser: internal links checked: {checker.links_checked} (with anchors); '
          f'external links not followed: {checker.links_external}')
    hosts = sorted({urlsplit(u).hostname for u in checker.blocked})
    print(f'docs-browser: external requests blocked: {len(checker.blocked)} '
          f'({", ".join(hosts) or "none"})')
    for query, hrefs in found.items():
        print(f'docs-browser: search "{query}": {len(hrefs)} results'
              + (f', first {hrefs[0].replace(base, "")}' if hrefs else ''))
    for shot, pixels, heading in taken:
        print(f'docs-browser: screenshot {shot} ({width}x{height}, {pixels["colours"]} '
              f'colours, {pixels["ink"]:.0%} ink, heading "{heading}")')
    print(f'docs-browser: {time.monotonic() - started:.1f} s')
    if problems:
        for line in problems:
            print(f'docs-browser: problem: {line}')
        print(f'docs-browser: FAILED: {len(problems)} problems')
        return 1
    print('docs-browser: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
