"""The supported-torch table from the output of .ci/compat runs (standard library only).

    python .ci/_matrix_table.py [--write PAGE] LOG [LOG ...]

Each LOG is what .ci/compat printed for one or more torch versions (.ci/matrix keeps
it in ${FP16UTILS_VENV_CACHE:-~/.cache/fp16utils}/matrix-VERSION.txt; several runs
may be concatenated in one file). A run ends with its summary line,

    compat-result: VERSION PASSED SKIPPED FAILED ERRORS [NOTE]

and the ``SKIPPED [N] path:line: reason`` lines of pytest's ``-ra`` report before it
belong to that run: the reasons are summed per text (a leading ``FILE:LINE:`` left
out), most frequent first. The table goes to stdout, or with ``--write PAGE`` replaces
what stands between the two marker comments of PAGE (BEGIN and END below), the rest of
the page kept as it is.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional

BEGIN = '<!-- supported-torch-table:begin (written by .ci/matrix --write) -->'
END = '<!-- supported-torch-table:end -->'
HEADER = ('| torch | passed | skipped | failed | errors | skipped because (tests) |\n'
          '|---|---:|---:|---:|---:|---|')

_RESULT = re.compile(r'^compat-result: (?P<fields>.*)$')
_SKIPPED = re.compile(r'^SKIPPED \[(?P<count>\d+)\] \S+?:(?:\d+:)? (?P<reason>.+)$')
_WHERE = re.compile(r'^[\w./-]+:\d+: ')


class Row(NamedTuple):
    """One torch version's results."""

    version: str
    passed: str
    skipped: str
    failed: str
    errors: str
    note: str
    reasons: Dict[str, int]


def parse(lines: Iterable[str]) -> List[Row]:
    """The runs found in ``lines``, in order; a later run of a version replaces an earlier."""
    rows: Dict[str, Row] = {}
    reasons: Dict[str, int] = {}
    for raw in lines:
        line = raw.rstrip('\n')
        skipped = _SKIPPED.match(line)
        if skipped:
            # A reason that starts by naming where (README.md:18: ...) counts as one.
            reason = _WHERE.sub('', skipped.group('reason').strip())
            reasons[reason] = reasons.get(reason, 0) + int(skipped.group('count'))
            continue
        result = _RESULT.match(line)
        if result:
            fields = result.group('fields').split()
            if len(fields) < 5:
                raise ValueError(f'not a compat-result line (VERSION PASSED SKIPPED FAILED '
                                 f'ERRORS [NOTE]): {line!r}')
            version, passed, skip, failed, errors = fields[:5]
            rows.pop(version, None)
            rows[version] = Row(version, passed, skip, failed, errors, ' '.join(fields[5:]),
                                reasons)
            reasons = {}
    return list(rows.values())


def markdown_text(text: str) -> str:
    """``text`` shown as it is inside a Markdown table cell (``_foreach_copy_`` stays)."""
    for char in '\\`*_[]|':
        text = text.replace(char, '\\' + char)
    return text.replace('<', '&lt;')


def because(row: Row) -> str:
    """The skip reasons of a run, ``reason (N)`` most frequent first; or its note."""
    if row.note:
        return markdown_text(row.note)
    ordered = sorted(row.reasons.items(), key=lambda item: (-item[1], item[0]))
    return '; '.join(f'{markdown_text(reason)} ({count})' for reason, count in ordered)


def table(rows: List[Row]) -> str:
    """The Markdown table of ``rows``."""
    if not rows:
        raise ValueError('no compat-result line found: nothing to tabulate')
    body = [f'| {r.version} | {r.passed} | {r.skipped} | {r.failed} | {r.errors} | '
            f'{because(r)} |' for r in rows]
    return '\n'.join([HEADER, *body]) + '\n'


def replace_table(page: str, new_table: str) -> str:
    """``page`` with what stands between the markers replaced by ``new_table``.

    The table stands between blank lines, so that Markdown reads it as a table.
    """
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f'the page needs exactly one {BEGIN!r} followed by one {END!r}')
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f'{head}{BEGIN}\n\n{new_table}\n{END}{tail}'


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--write', metavar='PAGE', help='replace the table in PAGE')
    parser.add_argument('logs', nargs='+', metavar='LOG', help='output of .ci/compat')
    args = parser.parse_args(argv)
    lines: List[str] = []
    for log in args.logs:
        lines += Path(log).read_text(encoding='utf-8', errors='replace').splitlines()
    try:
        text = table(parse(lines))
        if args.write:
            page = Path(args.write)
            page.write_text(replace_table(page.read_text(encoding='utf-8'), text),
                            encoding='utf-8')
    except (OSError, ValueError) as err:
        sys.stderr.write(f'matrix: {err}\n')
        return 1
    sys.stdout.write(text)
    if args.write:
        sys.stdout.write(f'wrote the table into {args.write}\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
