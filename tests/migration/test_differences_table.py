"""The pairing rule and the differences table, on small made-up releases (no mmengine needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

yaml = pytest.importorskip('yaml', reason='the pairing reads metafiles with PyYAML')

from _differences import (  # noqa: E402
    ABSENT,
    Difference,
    differences,
    explain,
    matches,
    read_table,
    summary,
)
from _pairing import pair_configs  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / 'docs' / 'migration' / 'upstream.md'
HEAD = ('## Differences\n\n| Codebase | Configs | Key | Ours | Upstream | Reason |\n'
        '|---|---|---|---|---|---|\n')


def _table(tmp_path: Path, *rows: str) -> Path:
    page = tmp_path / 'page.md'
    page.write_text('# t\n\n' + HEAD + '\n'.join(rows) + '\n\n## After\n\n| a | b |\n')
    return page


def test_a_star_is_any_text_and_brackets_are_themselves() -> None:
    assert matches('param_scheduler[*].end', 'param_scheduler[12].end')
    assert not matches('param_scheduler[*].end', 'param_scheduler.end')
    assert matches('*pascal_context_59.py', 'fcn/fcn_r50_480x480_40k_pascal_context_59.py')
    assert not matches('poolformer/*', 'fpn/poolformer.py')


def test_leaves_that_differ_are_listed_with_absent_sides() -> None:
    ours = dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(lr=0.02)),
                param_scheduler=[dict(type='LinearLR', end=501)])
    theirs = dict(optim_wrapper=dict(optimizer=dict(lr=0.02), clip_grad=None),
                  param_scheduler=dict(type='LinearLR', end=500))
    found = differences('mmdet', 'a/b.py', ours, theirs, ('optim_wrapper', 'param_scheduler'))
    assert [(d.key, d.ours, d.upstream) for d in found] == [
        ('optim_wrapper.type', 'OptimWrapper', ABSENT),
        ('optim_wrapper.clip_grad', ABSENT, None),
        ('param_scheduler[0].end', 501, 500)]  # a lone dict reads as a one-item list


def test_rows_explain_by_value_expression_and_old_config(tmp_path: Path) -> None:
    page = _table(
        tmp_path,
        "| `*` | `*` | `optim_wrapper.clip_grad` | `absent` | `None` | default |",
        "| `mmdet` | `*` | `param_scheduler[*].end` | `= upstream + 1` | `*` | one short |",
        "| `*` | `*` | `train_cfg.max_iters` | `= old['runner']['max_iters']` | `*` | upstream |",
        "| `mmseg` | `*` | `*` | `*` | `*` | never used |")
    rows = read_table(page)
    old = dict(runner=dict(max_iters=80000))
    diffs = [Difference('mmdet', 'x.py', 'optim_wrapper.clip_grad', ABSENT, None),
             Difference('mmdet', 'x.py', 'param_scheduler[0].end', 501, 500),
             Difference('mmdet', 'y.py', 'param_scheduler[1].end', 502, 500),
             Difference('mmdet', 'x.py', 'train_cfg.max_iters', 80000, 40000, old),
             Difference('mmdet', 'z.py', 'train_cfg.max_iters', 90000, 40000, old)]
    unexplained = explain(diffs, rows)
    assert [(d.config, d.key) for d in unexplained] == [
        ('y.py', 'param_scheduler[1].end'), ('z.py', 'train_cfg.max_iters')]
    assert [r.matched for r in rows] == [1, 1, 1, 0]  # the last row is stale
    assert '1 x mmdet param_scheduler[*].end: ours 502 | upstream 500  (e.g. y.py)' in \
        summary(unexplained)


def test_a_row_with_a_bad_cell_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='is not a Python literal'):
        read_table(_table(tmp_path, '| `*` | `*` | `k` | `not python` | `1` | why |'))
    with pytest.raises(ValueError, match='needs 6 cells'):
        read_table(_table(tmp_path, '| `*` | `*` | `k` | `1` | why |'))


def test_the_docs_table_reads() -> None:
    rows = read_table(PAGE)
    assert len(rows) > 20 and all(r.reason for r in rows)
    assert all(r.codebase in ('*', 'mmdet', 'mmseg', 'mmcls', 'mmedit', 'mmgen') for r in rows)


def _release(root: Path, configs: dict, models: list) -> Path:
    for rel in configs:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text('x = 1\n')
    (root / 'metafile.yml').write_text(yaml.safe_dump({'Models': models}))
    return root


def test_configs_pair_by_checkpoint_then_by_name(tmp_path: Path) -> None:
    url = 'https://download.openmmlab.com/mmdetection/v2.0/faster_rcnn/{0}/{0}_20200130-abcdef12.pth'
    old = _release(tmp_path / 'old', {
        'faster_rcnn/faster_rcnn_r50_fpn_1x_coco.py': 1,  # checkpoint, by its folder name
        'beit/upernet_beit-base_8x2_640x640_160k_ade20k.py': 1,  # checkpoint, in the metafile
        'yolo/yolov3_d53_320_273e_coco.py': 1,  # by name only
        'ssd/ssd300_coco.py': 1,  # no 1.x config
        'two/two_a.py': 1,  # two 1.x configs name its checkpoint
    }, [dict(Name='b', Config='configs/beit/upernet_beit-base_8x2_640x640_160k_ade20k.py',
             Weights='https://x/beit.pth')])
    new_configs = ['faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
                   'beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py',
                   'yolo/yolov3_d53_320-273e_coco.py', 'two/one.py', 'two/other.py']
    new = _release(tmp_path / 'new', dict.fromkeys(new_configs), [
        dict(Name='f', Config='configs/' + new_configs[0],
             Weights=url.format('faster_rcnn_r50_fpn_1x_coco')),
        dict(Name='b', Config='configs/' + new_configs[1], Weights='https://x/beit.pth'),
        dict(Name='o', Config='configs/two/one.py', Weights=url.format('two_a')),
        dict(Name='p', Config='configs/two/other.py', Weights=url.format('two_a'))])
    olds = sorted(p.relative_to(old).as_posix() for p in old.rglob('*.py'))
    pairs = pair_configs(old, olds, new, new_configs)
    assert {k: (p.new, p.rule) for k, p in pairs.items()} == {
        'faster_rcnn/faster_rcnn_r50_fpn_1x_coco.py': (new_configs[0], 'checkpoint'),
        'beit/upernet_beit-base_8x2_640x640_160k_ade20k.py': (new_configs[1], 'checkpoint'),
        'yolo/yolov3_d53_320_273e_coco.py': (new_configs[2], 'name'),
        'ssd/ssd300_coco.py': (None, 'none'),
        'two/two_a.py': (None, 'ambiguous')}
