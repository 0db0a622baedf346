"""Print the requirements of pyproject.toml's extras, one a line, for the install scripts.

pyproject.toml stays the single source of truth: the images and CI install what these lines say.
Self-references such as ``smso[training]`` are resolved; duplicates are printed once.

    python docker/requirements.py serving            # the serving image's dependencies
    python docker/requirements.py training export    # the training image's dependencies
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    groups = project.get("optional-dependencies", {})
    own = normalize(project["name"])
    self_ref = re.compile(rf"^\s*{re.escape(project['name'])}\s*\[([^\]]*)\]\s*$", re.IGNORECASE)
    found: list[str] = []
    seen_extras: set[str] = set()

    def visit(extra: str) -> None:
        if extra in seen_extras:
            return
        if extra not in groups:
            raise SystemExit(
                f"requirements.py: {pyproject} has no extra {extra!r}; it has {sorted(groups)}"
            )
        seen_extras.add(extra)
        for line in groups[extra]:
            match = self_ref.match(line)
            if match:
                for inner in match.group(1).split(","):
                    visit(inner.strip())
            elif normalize(re.split(r"[\s\[<>=!~;@]", line.strip(), maxsplit=1)[0]) == own:
                raise SystemExit(f"requirements.py: {line!r} in [{extra}] is not 'name[extras]'")
            elif line not in found:
                found.append(line)

    for extra in extras:
        visit(extra)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="+", help="names under [project.optional-dependencies]")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    args = parser.parse_args()
    print("\n".join(requirements(args.pyproject, args.extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
