"""``explain`` and ``report``: what a bundle on disk resembles, and the upstream issue for it.

Exit status: 0 done; 64 bad input (a bad signature file, a .tar.gz: one line naming the fix);
65 a directory that is no bundle (it has no manifest.json); 66 no such bundle (a path that does
not exist or cannot be read, sysexits' EX_NOINPUT, as docs/reliability.md's scheme says); 73
report.md could not be written.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import click

from engine_watchdog.cli.exits import EXIT_CANTCREAT, EXIT_DATAERR, EXIT_NOINPUT, CliError
from engine_watchdog.hangs import (
    BundleNotFound,
    SignatureFileError,
    SignatureSet,
    explain_bundle,
    load_signatures,
    manifest_matches,
    write_report,
)

BUNDLE = click.argument("bundle", type=click.Path(path_type=Path))
SIGNATURES = click.option(
    "--signatures",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="ENGINE_WATCHDOG_SIGNATURES",
    show_envvar=True,
    help="Known-hang signature file [default: the one shipped with engine-watchdog].",
)


def signatures_or_exit(path: Path | None) -> SignatureSet:
    try:
        return load_signatures(path)
    except SignatureFileError as exc:
        raise CliError(f"{exc}; fix the file or leave out --signatures") from None
    except OSError as exc:
        raise CliError(f"--signatures {path}: cannot read it ({exc.strerror})") from None


MANIFEST = "manifest.json"
"""Every bundle has one (capture/bundle.py writes it last, then renames the directory in)."""
EVIDENCE = (MANIFEST, "pyspy", "gpu.json")
"""What marks a folder as a bundle's evidence: a bundle's manifest, or the parts the matcher
reads (evidence gathered by hand, as tests/gpu/verify_gpu.py does, has no manifest)."""


def _bundle_dir(bundle: Path) -> Path:
    """``bundle`` if it is a bundle directory; a missing path is left to the reader (its error
    names the path); a directory without a manifest is refused here, or every signature would
    simply not match and the command would say "nothing matches" of a random folder."""
    if bundle.name.endswith(".tar.gz") and bundle.is_file():
        raise CliError(f"{bundle} is a .tar.gz bundle: unpack it first (tar xzf {bundle.name})")
    try:
        is_dir = stat.S_ISDIR(os.lstat(bundle).st_mode)
    except OSError:
        return bundle
    if is_dir and not any((bundle / part).exists() for part in EVIDENCE):
        raise CliError(_not_a_bundle(bundle), EXIT_DATAERR)
    return bundle


def _not_a_bundle(folder: Path) -> str:
    line = f"{folder} is not an incident bundle: a bundle directory has a {MANIFEST}"
    try:
        inside = sorted(p for p in folder.iterdir() if (p / MANIFEST).is_file())
    except OSError:
        inside = []
    if inside:  # the incident directory itself, most likely
        return f"{line}; this folder holds {len(inside)} bundle(s): give one, e.g. {inside[-1]}"
    return f"{line} (give the path that capture printed, <incident-dir>/<UTC>-<engine>-<cause>)"


@click.command("explain")
@BUNDLE
@SIGNATURES
@click.option("--json", "as_json", is_flag=True, help="The matches as one JSON document.")
def explain_command(bundle: Path, signatures: Path | None, as_json: bool) -> None:
    """Say which known upstream hangs an incident bundle resembles, and the evidence."""
    sigs = signatures_or_exit(signatures)
    try:
        section, matches = explain_bundle(_bundle_dir(bundle), sigs)
    except BundleNotFound as exc:
        raise CliError(str(exc), EXIT_NOINPUT) from None
    if as_json:
        click.echo(json.dumps({"bundle": str(bundle), "known_hangs": manifest_matches(matches)}))
    else:
        click.echo(section, nl=False)


@click.command("report")
@BUNDLE
@SIGNATURES
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write it [default: report.md inside the bundle].",
)
def report_command(bundle: Path, signatures: Path | None, output: Path | None) -> None:
    """Write report.md for an upstream issue, in the shape of the engine's bug template."""
    sigs = signatures_or_exit(signatures)
    try:
        path = write_report(_bundle_dir(bundle), sigs, output)
    except BundleNotFound as exc:
        raise CliError(str(exc), EXIT_NOINPUT) from None
    except OSError as exc:
        where = output or bundle / "report.md"
        raise CliError(f"cannot write {where} ({exc.strerror})", EXIT_CANTCREAT) from None
    click.echo(str(path))
