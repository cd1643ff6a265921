"""Which OpenMMLab codebase a 0.x config belongs to, and its rules for the ``fp16`` key.

mmdet 2.x training reads ``cfg.fp16`` (``Fp16OptimizerHook(**optimizer_config, **fp16)``);
mmsegmentation 0.x training does not (only its ``tools/test.py`` does). Each rule below
was read in the codebase's own ``apis/train.py`` and ``tools/test.py``
(docs/migration/convert-config.md#codebase-rules says which release).
:func:`find_codebase` tells the codebase from a name, the config's path or its contents.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, NamedTuple, Optional, Union

__all__ = ['CODEBASES', 'FP16_RULES', 'Fp16Rule', 'constructor_in_1x', 'find_codebase']


class Fp16Rule(NamedTuple):
    """What a codebase's 0.x scripts do with a config's ``fp16`` key."""

    train: bool  # apis/train.py builds Fp16OptimizerHook from it
    test: bool  # tools/test.py calls wrap_fp16_model when it is set
    train_text: str  # one phrase: what training does with it


_MMDET_TRAIN = 'training builds Fp16OptimizerHook(**optimizer_config, **fp16)'
#: codebase -> its rule for ``fp16``.
FP16_RULES: dict[str, Fp16Rule] = {
    'mmdet': Fp16Rule(True, True, _MMDET_TRAIN),
    'mmseg': Fp16Rule(False, True, 'training does not read fp16 (only optimizer_config '
                      "type='Fp16OptimizerHook' turns mixed precision on)"),
    'mmcls': Fp16Rule(True, True, 'training builds Fp16OptimizerHook(**optimizer_config, '
                      "loss_scale=fp16['loss_scale'])"),
    'mmedit': Fp16Rule(False, False, 'neither training nor testing reads fp16'),
    'mmgen': Fp16Rule(False, False, 'training does not read fp16 (mixed precision comes '
                      'from runner.fp16_loss_scaler and the models\' fp16 flags)'),
    'mmdet3d': Fp16Rule(True, True, _MMDET_TRAIN + ' (detectors; EncoderDecoder3D '
                        'segmentors follow mmseg)'),
    'mmocr': Fp16Rule(True, True, _MMDET_TRAIN),
    'mmpose': Fp16Rule(True, True, _MMDET_TRAIN),
    'mmrotate': Fp16Rule(True, True, _MMDET_TRAIN),
}

#: The codebase names ``--codebase`` takes.
CODEBASES = tuple(FP16_RULES)

#: Directory names (a checkout, a package, a wheel or sdist folder) -> codebase.
_DIR_NAMES = {
    'mmdet': 'mmdet', 'mmdetection': 'mmdet',
    'mmseg': 'mmseg', 'mmsegmentation': 'mmseg',
    'mmcls': 'mmcls', 'mmclassification': 'mmcls',
    'mmedit': 'mmedit', 'mmediting': 'mmedit',
    'mmgen': 'mmgen', 'mmgeneration': 'mmgen',
    'mmdet3d': 'mmdet3d', 'mmdetection3d': 'mmdet3d',
    'mmocr': 'mmocr', 'mmpose': 'mmpose', 'mmrotate': 'mmrotate',
}
_DIR_RE = re.compile(r'^([a-z0-9]+?)(?:[-_.]v?\d[\w.+-]*)?$')

#: The model types each codebase's 0.x registry holds (read from the releases named in
#: docs/migration/convert-config.md#codebase-rules); shared names are resolved below.
_MODEL_TYPES: dict[str, frozenset[str]] = {
    'mmseg': frozenset({'EncoderDecoder', 'CascadeEncoderDecoder'}),
    'mmcls': frozenset({'ImageClassifier'}),
    'mmdet': frozenset({
        'ATSS', 'AutoAssign', 'CascadeRCNN', 'CenterNet', 'CornerNet', 'DDOD', 'DETR',
        'DeformableDETR', 'FCOS', 'FOVEA', 'FSAF', 'FastRCNN', 'FasterRCNN', 'GFL',
        'GridRCNN', 'HybridTaskCascade', 'KnowledgeDistillationSingleStageDetector', 'LAD',
        'Mask2Former', 'MaskFormer', 'MaskRCNN', 'MaskScoringRCNN', 'NASFCOS', 'PAA',
        'PanopticFPN', 'PointRend', 'QueryInst', 'RPN', 'RepPointsDetector', 'RetinaNet',
        'SCNet', 'SOLO', 'SOLOv2', 'SingleStageDetector', 'SingleStageInstanceSegmentor',
        'SparseRCNN', 'TOOD', 'TridentFasterRCNN', 'TwoStageDetector',
        'TwoStagePanopticSegmentor', 'VFNet', 'YOLACT', 'YOLOF', 'YOLOV3', 'YOLOX'}),
    'mmedit': frozenset({
        'AOTInpaintor', 'BaseMattor', 'BasicInterpolator', 'BasicRestorer', 'BasicVSR',
        'CAIN', 'DIC', 'DIM', 'DeepFillv1Inpaintor', 'EDVR', 'ESRGAN', 'FLAVR', 'GCA',
        'GLEAN', 'GLInpaintor', 'IndexNet', 'LIIF', 'OneStageInpaintor', 'PConvInpaintor',
        'RealBasicVSR', 'RealESRGAN', 'SRGAN', 'TDAN', 'TTSR', 'TwoStageInpaintor',
        'CycleGAN', 'Pix2Pix'}),
    'mmgen': frozenset({
        'BaseTranslationModel', 'BasicConditionalGAN', 'BasiccGAN', 'BasicGaussianDiffusion',
        'MSPIEStyleGAN2', 'PESinGAN', 'ProgressiveGrowingGAN', 'SinGAN',
        'StaticTranslationGAN', 'StaticUnconditionalGAN', 'StyleGANV1', 'StyleGANv1',
        'CycleGAN', 'Pix2Pix'}),
    'mmdet3d': frozenset({
        'VoxelNet', 'DynamicVoxelNet', 'MVXFasterRCNN', 'MVXTwoStageDetector', 'CenterPoint',
        'PartA2', 'VoteNet', 'H3DNet', 'ImVoteNet', 'ImVoxelNet', 'GroupFree3DNet',
        'FCOSMono3D', 'SMOKEMono3D', 'PointRCNN', 'SASSD', 'EncoderDecoder3D'}),
    'mmocr': frozenset({
        'DBNet', 'PSENet', 'PANet', 'FCENet', 'DRRG', 'TextSnake', 'MaskRCNNTextDetector',
        'CRNNNet', 'SARNet', 'NRTR', 'RobustScanner', 'SATRN', 'ABINet', 'MASTER', 'SDMGR',
        'EncodeDecodeRecognizer'}),
    'mmpose': frozenset({
        'TopDown', 'BottomUp', 'PoseLifter', 'Interhand3D', 'AssociativeEmbedding',
        'MultiTask', 'DetectAndRegress', 'VoxelCenterDetector', 'VoxelSinglePose',
        'CID', 'DisentangledKeypointRegressor', 'ParametricMesh'}),
    'mmrotate': frozenset({
        'RotatedRetinaNet', 'OrientedRCNN', 'RoITransformer', 'ReDet', 'S2ANet',
        'RotatedFasterRCNN', 'GlidingVertex', 'R3Det', 'RotatedFCOS', 'RotatedRepPoints',
        'RotatedSingleStageDetector', 'RotatedTwoStageDetector', 'OrientedRepPoints',
        'KFIoURRetinaNet', 'CSLRRetinaNet', 'RotatedATSS'}),
}

#: Dataset types, when the model type tells nothing (a child config without ``model``).
_DATASET_TYPES: dict[str, frozenset[str]] = {
    'mmseg': frozenset({
        'ADE20KDataset', 'PascalVOCDataset', 'COCOStuffDataset', 'PascalContextDataset',
        'PascalContextDataset59', 'ISPRSDataset', 'LoveDADataset', 'PotsdamDataset',
        'iSAIDDataset', 'ChaseDB1Dataset', 'STAREDataset', 'HRFDataset', 'DRIVEDataset',
        'DarkZurichDataset', 'NightDrivingDataset'}),
    'mmcls': frozenset({
        'ImageNet', 'ImageNet21k', 'CIFAR10', 'CIFAR100', 'MNIST', 'FashionMNIST', 'CUB',
        'StanfordCars', 'VOC'}),
    'mmdet': frozenset({
        'CocoDataset', 'VOCDataset', 'LVISV1Dataset', 'LVISV05Dataset', 'LVISDataset',
        'CocoPanopticDataset', 'Objects365V1Dataset', 'Objects365V2Dataset',
        'OpenImagesDataset', 'OpenImagesChallengeDataset', 'WIDERFaceDataset',
        'DeepFashionDataset', 'XMLDataset'}),
    'mmedit': frozenset({
        'ImgInpaintingDataset', 'AdobeComp1kDataset', 'SRAnnotationDataset',
        'SRFolderDataset', 'SRFolderGTDataset', 'SRREDSDataset', 'SRREDSMultipleGTDataset',
        'SRVimeo90KDataset', 'SRVimeo90KMultipleGTDataset', 'SRFacialLandmarkDataset',
        'SRFolderMultipleGTDataset', 'SRFolderRefDataset', 'GenerationPairedDataset',
        'GenerationUnpairedDataset', 'VFIVimeo90KDataset', 'VFIVimeo90K7FramesDataset'}),
    'mmgen': frozenset({
        'UnconditionalImageDataset', 'UnpairedImageDataset', 'PairedImageDataset',
        'GrowScaleImgDataset', 'SinGANDataset', 'QuickTestImageDataset'}),
}
_WRAPPING_DATASETS = frozenset({'RepeatDataset', 'ConcatDataset', 'ClassBalancedDataset',
                                'MultiImageMixDataset'})

#: (codebase, 0.x constructor) -> (the 1.x name, where the 1.x codebase ships it).
_CONSTRUCTORS_1X: dict[tuple[str, str], tuple[str, str]] = {
    ('mmdet', 'LearningRateDecayOptimizerConstructor'): (
        'LearningRateDecayOptimizerConstructor', 'mmdet 3.x'),
    ('mmseg', 'LearningRateDecayOptimizerConstructor'): (
        'LearningRateDecayOptimizerConstructor', 'mmseg 1.x'),
    ('mmseg', 'LayerDecayOptimizerConstructor'): (
        'LayerDecayOptimizerConstructor', 'mmseg 1.x'),
    ('mmcls', 'LearningRateDecayOptimizerConstructor'): (
        'LearningRateDecayOptimWrapperConstructor', 'mmpretrain 1.x'),
}


def constructor_in_1x(codebase: Optional[str], name: str) -> Optional[tuple[str, str]]:
    """(1.x name, which 1.x codebase ships it) for a 0.x named constructor, or None."""
    if codebase is None:
        return None
    return _CONSTRUCTORS_1X.get((codebase, name))


def _from_path(path: Union[str, os.PathLike[str]]) -> Optional[str]:
    """The codebase named by the nearest folder above the config file, or None."""
    for part in reversed(PurePath(os.fspath(path)).parent.parts):
        match = _DIR_RE.match(part.lower())
        if match and match.group(1) in _DIR_NAMES:
            return _DIR_NAMES[match.group(1)]
    return None


def _dataset_type(cfg: Mapping[str, Any]) -> Optional[str]:
    """The type of ``data.train`` (through Repeat/Concat wrappers), or None."""
    data = cfg.get('data')
    train = data.get('train') if isinstance(data, Mapping) else None
    for _ in range(4):
        if isinstance(train, (list, tuple)) and train:
            train = train[0]
        if not isinstance(train, Mapping):
            return None
        if train.get('type') not in _WRAPPING_DATASETS:
            break
        train = train.get('dataset', train.get('datasets'))
    kind = train.get('type') if isinstance(train, Mapping) else None
    return kind if isinstance(kind, str) else None


def _from_contents(cfg: Mapping[str, Any]) -> Optional[str]:
    """The codebase told by the model type, else the dataset type; None when unsure."""
    model = cfg.get('model')
    kind = model.get('type') if isinstance(model, Mapping) else None
    if isinstance(kind, str):
        found = [cb for cb, names in _MODEL_TYPES.items() if kind in names]
        if len(found) > 1 and set(found) == {'mmedit', 'mmgen'}:
            # CycleGAN/Pix2Pix are in both: mmedit's configs say ``optimizers``.
            return 'mmedit' if 'optimizers' in cfg else 'mmgen'
        if len(found) == 1:
            return found[0]
    if 'optimizers' in cfg:  # read by MMEditing 0.x's build_optimizers only
        return 'mmedit'
    dataset = _dataset_type(cfg)
    if dataset is not None:
        if '.' in dataset:  # 'mmcls.ImageNet' in an mmgen config: another scope's name
            return None
        found = [cb for cb, names in _DATASET_TYPES.items() if dataset in names]
        if len(found) == 1:
            return found[0]
    return None


def find_codebase(cfg: Mapping[str, Any], codebase: Optional[str],
                  path: Union[str, os.PathLike[str], None]) -> Optional[str]:
    """The codebase whose rules apply to ``cfg``; ``None`` when it cannot be told.

    An explicit ``codebase`` wins; else the nearest folder above ``path`` that names
    one (``mmdet/.mim/configs/...`` in an installed wheel, ``mmdetection/configs/...``
    in a checkout); else the config's model type, then its training dataset type.

    Args:
        cfg: the 0.x config (``_base_`` files merged).
        codebase: a name from :data:`CODEBASES`, or None to tell it.
        path: where the config file is, or None.

    Returns:
        A name from :data:`CODEBASES`, or None.

    Raises:
        ValueError: ``codebase`` is not one of :data:`CODEBASES`.

    Example:
        >>> find_codebase({}, None, 'mmsegmentation/configs/fcn/fcn_r50.py')
        'mmseg'
        >>> find_codebase(dict(model=dict(type='ImageClassifier')), None, None)
        'mmcls'
    """
    if codebase is not None:
        if codebase not in FP16_RULES:
            raise ValueError(
                f'codebase: {codebase!r} is not one of {", ".join(CODEBASES)}; pass one of '
                'these names (see docs/migration/convert-config.md#codebase-rules)'
            )
        return codebase
    if path is not None:
        found = _from_path(path)
        if found is not None:
            return found
    return _from_contents(cfg)
