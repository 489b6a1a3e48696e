"""Build the guard's C modules, as pyproject.toml lists them, with gcc alone (no setuptools, no
installed headers needed): the device run of benchmarks/scale.py builds the tree's own there
(benchmarks/scale_device.sh), with Python's headers carried in .whl/ (scale_prepare.sh).

    python3 benchmarks/scale_build.py --include DIR (--inplace | --out DIR) [--check DIR]

``--check DIR``: copy DIR's modules in place instead, if their sources are the tree's (the
SOURCES.sha256 written beside them); exit 1 if not. Flags: setuptools' defaults for CPython.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ("-DNDEBUG", "-fwrapv", "-O3", "-Wall", "-fPIC", "-shared", "-pthread")


def modules() -> list[dict[str, object]]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(doc["tool"]["setuptools"]["ext-modules"])


def digest() -> str:
    files = sorted({f for m in modules() for f in [*m["sources"], *m.get("depends", [])]})  # type: ignore[misc]
    return "\n".join(f"{hashlib.sha256((ROOT / f).read_bytes()).hexdigest()}  {f}" for f in files)


def target(name: str, out: Path | None) -> Path:
    *package, leaf = name.split(".")
    folder = out if out is not None else ROOT.joinpath(*package)
    return folder / (leaf + str(sysconfig.get_config_var("EXT_SUFFIX")))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--include", type=Path, help="Python.h's folder")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--inplace", action="store_true")
    parser.add_argument("--check", type=Path, help="a folder of modules built earlier")
    args = parser.parse_args()
    if args.check:
        if (args.check / "SOURCES.sha256").read_text().strip() != digest():
            print(
                "scale_build: the modules in .whl/so were built from other sources", file=sys.stderr
            )
            return 1
        for m in modules():
            shutil.copy2(target(str(m["name"]), args.check), target(str(m["name"]), None))
        return 0
    include = args.include or Path(sysconfig.get_paths()["include"])
    out = None if args.inplace else args.out
    for m in modules():
        sources = [str(ROOT / s) for s in m["sources"]]  # type: ignore[attr-defined]
        dirs = [f"-I{ROOT / d}" for d in m.get("include-dirs", [])]  # type: ignore[attr-defined]
        extra = [str(f) for f in m.get("extra-compile-args", [])]  # type: ignore[attr-defined]
        built = target(str(m["name"]), out)
        built.parent.mkdir(parents=True, exist_ok=True)
        command = ["gcc", *FLAGS, *extra, f"-I{include}", *dirs, *sources, "-o", str(built)]
        subprocess.run(command, check=True, timeout=300)  # noqa: S603 (gcc, our sources)
        print(f"built {built.relative_to(ROOT) if built.is_relative_to(ROOT) else built}")
    if out is not None:
        (out / "SOURCES.sha256").write_text(digest() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
