"""``report.md``: the upstream bug report, in the shape of the engine's own issue template.

vLLM's template asks for "Your current environment" and "Describe the bug"; SGLang's for
"Describe the bug", "Reproduction" and "Environment". The report fills them from the bundle and
stays under GitHub's 65,536-character limit on an issue body: when the whole report is longer,
the least useful parts shrink first (the log tail, then stacks of secondary processes and deep
frames, then the tables), and a note at the end says what was cut. Pure: text in, text out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from engine_watchdog.hangs import report_parts as rp
from engine_watchdog.hangs.collectives import collectives_lines
from engine_watchdog.hangs.match import Match, reported
from engine_watchdog.hangs.render import named_lines, nothing_matched
from engine_watchdog.hangs.schema import SignatureSet
from engine_watchdog.hangs.view import BundleView

GITHUB_LIMIT = 65536
MARGIN = 600
"""Kept free below the limit for the trimming note and the footer."""
_MAIN_ROLES = ("engine-core", "worker")


Variant = tuple[Callable[[], list[str]], str]
"""(how to render the lines, what this variant leaves out); built only when needed."""


@dataclass
class Part:
    variants: Sequence[Variant]
    level: int = 0
    _cache: dict[int, list[str]] = field(default_factory=dict)

    @property
    def lines(self) -> list[str]:
        if self.level not in self._cache:
            self._cache[self.level] = self.variants[self.level][0]()
        return self._cache[self.level]

    @property
    def left_out(self) -> str:
        return self.variants[self.level][1]


# Which part shrinks, in order, until the report fits: least useful first.
TRIM_STEPS: tuple[tuple[str, int], ...] = (
    ("log", 1),
    ("stacks", 1),
    ("log", 2),
    ("stacks", 2),
    ("actions", 1),
    ("timeline", 1),
    ("stacks", 3),
    ("log", 3),
    ("matches", 1),
    ("where", 1),
    ("cmdline", 1),
    ("stacks", 4),
    ("timeline", 2),
    ("actions", 2),
)


def _parts(view: BundleView, matches: Sequence[Match], sigs: SignatureSet) -> dict[str, Part]:
    v = view
    return {
        "cmdline": Part(
            [
                (partial(rp.command_lines, v), ""),
                (partial(rp.command_lines, v, 300), "command-line arguments beyond 300 characters"),
            ]
        ),
        "timeline": Part(
            [
                (partial(rp.timeline_table, v, 12, 8), ""),
                (partial(rp.timeline_table, v, 4, 3), "timeline rows beyond 7"),
                (partial(_gone, "timeline.jsonl"), "the timeline table"),
            ]
        ),
        "where": Part(
            [
                (partial(rp.where_stuck, v, 60), ""),
                (partial(rp.where_stuck, v, 15), "'where it is stuck' lines beyond 15"),
            ]
        ),
        "stacks": _stacks_part(v),
        "collectives": Part([(partial(_collectives, v), "")]),
        "matches": Part(
            [
                (partial(_matches, matches, sigs, True), ""),
                (partial(_matches, matches, sigs, False), "the evidence of each known-issue match"),
            ]
        ),
        "actions": Part(
            [
                (partial(rp.actions_table, v, 50), ""),
                (partial(rp.actions_table, v, 10), "actions older than the last 10"),
                (partial(_gone, "actions.jsonl"), "the actions table"),
            ]
        ),
        "log": Part(
            [
                (partial(rp.log_tail, v, 200), ""),
                (partial(rp.log_tail, v, 60), "engine log lines beyond the last 60"),
                (partial(rp.log_tail, v, 15), "engine log lines beyond the last 15"),
                (partial(_gone, "engine.log"), "the engine log"),
            ]
        ),
    }


def _stacks_part(v: BundleView) -> Part:
    return Part(
        [
            (partial(rp.stack_sections, v, None, 40, False), ""),
            (partial(rp.stack_sections, v, None, 15, False), "stack frames beyond 15 per stack"),
            (
                partial(rp.stack_sections, v, _MAIN_ROLES, 15, False),
                "stack frames beyond 15, stacks of API-server and other processes",
            ),
            (
                partial(rp.stack_sections, v, _MAIN_ROLES, 12, True),
                "all stacks but each engine process's main thread (12 frames)",
            ),
            (partial(_gone, "pyspy/*.txt"), "all stacks"),
        ]
    )


def _collectives(view: BundleView) -> list[str]:
    return collectives_lines(view.collectives) if view.collectives else []


def _gone(where: str) -> list[str]:
    return [f"(left out to fit the limit: see {where} in the bundle)"]


def _matches(matches: Sequence[Match], sigs: SignatureSet, evidence: bool) -> list[str]:
    best = reported(matches)
    if not best:
        return [nothing_matched(matches, sigs)]
    return named_lines(best[:3], evidence)


def _environment(view: BundleView, sglang: bool) -> list[str]:
    return [
        "### Environment" if sglang else "### Your current environment",
        "",
        "<details><summary>From the engine-watchdog bundle (the engine's collect_env output is "
        "not part of it)</summary>",
        "",
        *rp.environment(view),
        "",
        "</details>",
        "",
    ]


def _body(parts: dict[str, Part]) -> list[str]:
    sections = (
        ("Command line** (as the watchdog captured it; secrets redacted):", "cmdline"),
        (
            "Timeline** (running and waiting requests, token rate; from the watchdog's scrapes):",
            "timeline",
        ),
        ("Where it is stuck** (engine-watchdog's reading of the stacks):", "where"),
        ("Stacks** (py-spy; identical stacks shown once):", "stacks"),
        ("Collectives** (each rank's last entry in the NCCL flight recorder):", "collectives"),
        ("Resembles known issues** (engine-watchdog's signatures):", "matches"),
        ("What was already tried** (the watchdog's actions and their results):", "actions"),
        ("Engine log** (tail):", "log"),
    )
    out: list[str] = []
    for title, key in sections:
        if parts[key].lines:  # a part with nothing to say (no flight-recorder dump) is left out
            out += [f"**{title}", "", *parts[key].lines, ""]
    return out


def _assemble(view: BundleView, parts: dict[str, Part]) -> str:
    sglang = view.engine == "sglang"
    env = _environment(view, sglang)
    heading = "### Describe the bug" if sglang else "### 🐛 Describe the bug"
    bug = [heading, "", *rp.describe_bug(view)]
    body = _body(parts)
    order = [*bug, *body, *env] if sglang else [*env, *bug, *body]
    footer = [f"<sub>Written by engine-watchdog from bundle `{view.name}`.</sub>"]
    trimmed = [p.left_out for p in parts.values() if p.level > 0]
    if trimmed:
        note = f"_Trimmed to fit GitHub's {GITHUB_LIMIT:,}-character limit: left out "
        footer.insert(0, note + "; ".join(trimmed) + "._\n")
    return "\n".join([*order, *footer, ""])


def render_report(
    view: BundleView, matches: Sequence[Match], signatures: SignatureSet, limit: int = GITHUB_LIMIT
) -> str:
    """The whole report.md, never longer than ``limit`` characters."""
    parts = _parts(view, matches, signatures)
    budget = limit - MARGIN
    text = _assemble(view, parts)
    for key, level in TRIM_STEPS:
        if len(text) <= budget:
            break
        part = parts[key]
        if part.level < level < len(part.variants):
            part.level = level
            text = _assemble(view, parts)
    text = _give_back(view, parts, text, budget)
    if len(text) > limit:
        note = "\n\n_Cut at GitHub's limit: the rest is in the bundle._\n"
        text = text[: limit - len(note)] + note
    return text


def _give_back(view: BundleView, parts: dict[str, Part], text: str, budget: int) -> str:
    """The trimming steps are coarse: undo what still fits, the most useful parts first."""
    if len(text) > budget:
        return text
    for key in dict.fromkeys(k for k, _ in reversed(TRIM_STEPS)):
        part = parts[key]
        while part.level > 0:
            part.level -= 1
            candidate = _assemble(view, parts)
            if len(candidate) > budget:
                part.level += 1
                break
            text = candidate
    return text
