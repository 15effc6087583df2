"""Print the project's runtime dependencies from pyproject.toml, one per line.

The image build installs these before copying the source tree, so a code change does not
invalidate the dependency layer. ``--exclude NAME`` drops a distribution (repeatable): the
GPU image keeps the torch that ships in the TensorRT-LLM container.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import tomllib


def distribution_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"cannot read a distribution name from {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("--exclude", action="append", default=[], metavar="NAME")
    args = parser.parse_args()
    excluded = {distribution_name(name) for name in args.exclude}
    project = tomllib.loads(args.pyproject.read_text(encoding="utf-8"))["project"]
    for requirement in project["dependencies"]:
        if distribution_name(requirement) not in excluded:
            print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
