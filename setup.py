"""Packaging for fp16utils."""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r"^__version__ = '([^']+)'",
                    (HERE / 'fp16utils' / '__init__.py').read_text(), re.M).group(1)

setup(
    name='fp16utils',
    version=VERSION,
    description='Mixed-precision training for PyTorch: the OpenMMLab 0.x fp16 API on '
                'any device, and a path to 1.x-style AMP optimizer wrappers.',
    long_description=(HERE / 'README.md').read_text(encoding='utf-8'),
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    python_requires='>=3.8',
    packages=find_packages(include=['fp16utils', 'fp16utils.*']),
    package_data={'fp16utils': ['py.typed']},
    install_requires=[
        'torch>=1.13',  # what each torch can do is asked at run time (fp16utils._torch)
        'numpy',
        'packaging',
    ],
    extras_require={
        'test': ['pytest>=7', 'hypothesis>=6'],
        'plot': ['matplotlib'],
        # `mkdocs build --strict`, pinned as the docs tier (.ci/docs) pins them. ruff
        # lets mkdocstrings lay long signatures out on several lines.
        'docs': ['mkdocs==1.6.1', 'mkdocs-material==9.8.2', 'mkdocstrings==1.0.8',
                 'mkdocstrings-python==2.0.11', 'pymdown-extensions==13.1.2',
                 'ruff==0.17.6'],
    },
    entry_points={'console_scripts': ['fp16utils=fp16utils.tools.cli:main']},
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
        'Typing :: Typed',
    ],
)
