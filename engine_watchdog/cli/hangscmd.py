"""``explain`` and ``report``: what a bundle on disk resembles, and the upstream issue for it.

Exit status: 0 done; 64 bad input (not a bundle, a bad signature file: one line naming the fix);
73 report.md could not be written.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from engine_watchdog.cli.errors import EXIT_CANTCREAT, CliError
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
    help="Known-hang signature file [default: the one shipped with engine-watchdog].",
)


def signatures_or_exit(path: Path | None) -> SignatureSet:
    try:
        return load_signatures(path)
    except SignatureFileError as exc:
        raise CliError(f"{exc}; fix the file or leave out --signatures") from None
    except OSError as exc:
        raise CliError(f"--signatures {path}: cannot read it ({exc.strerror})") from None


def _bundle_dir(bundle: Path) -> Path:
    if bundle.name.endswith(".tar.gz") and bundle.is_file():
        raise CliError(f"{bundle} is a .tar.gz bundle: unpack it first (tar xzf {bundle.name})")
    return bundle


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
        raise CliError(str(exc)) from None
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
        raise CliError(str(exc)) from None
    except OSError as exc:
        where = output or bundle / "report.md"
        raise CliError(f"cannot write {where} ({exc.strerror})", EXIT_CANTCREAT) from None
    click.echo(str(path))
