"""``mhaspec scoreboard``: the ecosystem conformance table, from the certificates.

Reads every certificate ``<dir>/*.json`` (default ``docs/certificates``; each is verified: schema,
digest, consistency), and renders, one row per implementation sorted by library,

* how much of the spec each was certified on: "N of M testable clauses", the core level (N of M)
  and the optional chapters attained (:mod:`mhaspec.coverage`);
* the core chapters and, apart, the optional ones: each cell a word and a count ("pass 5/5",
  "dev. 12/12", "FAIL 3/5", "not claimed") linked to the implementation's certificate (its
  Markdown form, where every clause is listed), its tooltip naming the clauses behind the word;
* the same grid as an SVG image (matplotlib, ``docs/assets/scoreboard.svg``) with a title (spec
  version, profile, dates of issue) that leads the section and opens full size when clicked,

into ``docs/matrix.md`` between the markers ``<!-- scoreboard:start -->`` and
``<!-- scoreboard:end -->``. Every string taken from a certificate is escaped for where it goes
(Markdown text, HTML attribute, image label). ``--certify NAME ...`` first (re)issues those
certificates with ``mhaspec certify NAME --profile ci --output-dir <dir>``; ``--certify all`` does
it for every registered backend that loads and has a device here. A chapter's word is the worst
verdict of its clauses (fail, deviation, pass, not implemented; "not run" when none ran).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import NamedTuple
from urllib.parse import quote

from mhaspec import certificate, coverage, usage
from mhaspec.certificate_markdown import md_text
from mhaspec.backends import loadable
from mhaspec.conformance import verdicts
from mhaspec.spec import load as load_spec

DEFAULT_DIR = pathlib.Path("docs/certificates")
DEFAULT_PAGE = pathlib.Path("docs/matrix.md")
DEFAULT_IMAGE = pathlib.Path("docs/assets/scoreboard.svg")
START, END = "<!-- scoreboard:start -->", "<!-- scoreboard:end -->"

#: chapter verdict -> (word in a cell, meaning in the legend, colour of the image cell)
STYLE = {
    "pass": ("pass", "every clause run passed", "#a5d6a7"),
    "deviation": ("dev.", "a declared deviation, confirmed by the suite", "#ffe082"),
    "stale-deviation": ("FAIL", "a deviation declared, but it conforms", "#ef9a9a"),
    "fail": ("FAIL", "a clause failed", "#ef9a9a"),
    "not-implemented": ("not claimed", "capability not claimed", "#eeeeee"),
    "not-run": ("not run", "no test ran", "#ffffff"),
}
#: Longest implementation or library name drawn in the image.
IMAGE_LABEL_CHARS = 48


class Row(NamedTuple):
    """One certified implementation: its name, library and version, verdict, the certificate's
    Markdown file name, chapter id -> (verdict, the clauses behind it), its coverage, and the
    inputs it was certified on (:func:`inputs_of`)."""

    name: str
    library: str
    verdict: str
    markdown: str
    cells: dict
    coverage: coverage.Coverage
    inputs: str = ""


def inputs_of(cert: dict) -> str:
    """``"certify profile, seed 123"`` or ``"ci profile, fixed inputs"``: what a certificate's
    Hypothesis settings drew its cases from."""
    hyp = cert["hypothesis"]
    seed = hyp.get("seed")
    return f"{hyp['profile']} profile, " + ("fixed inputs" if seed is None else f"seed {seed}")


class Superseded(NamedTuple):
    """A certificate issued against a draft that has since been released (not in the grid)."""

    name: str
    label: str
    issued: str
    markdown: str


class Board(NamedTuple):
    """Rows sorted by library, the core and optional chapter ids, the spec label, the profiles
    and devices the certificates ran with, their first and last date of issue, and the
    certificates of a draft since released."""

    rows: list[Row]
    core: list[str]
    optional: list[str]
    label: str
    profiles: list[str]
    devices: list[str]
    issued: tuple[str, str]
    superseded: list[Superseded]

    @property
    def chapters(self) -> list[str]:
        return self.core + self.optional


#: the mark of a chapter with a pass the adapter's fold made (``satisfied_by`` "adapter fold")
FOLD_MARK = "*"
FOLD_NOTE = f"a clause of it {verdicts.FOLD_MEANING}"


def attribute(text: object) -> str:
    """``text`` safe as a Markdown link title (an HTML attribute): one line, every character
    other than a letter, digit, space or ``,.:;-`` written as an HTML character reference, so
    none can end the title, the link or the table cell, nor open HTML or math."""
    line = "".join(c if c.isprintable() else " " for c in str(text))
    return "".join(c if c.isalnum() and c.isascii() or c in " ,.:;-" else f"&#{ord(c)};"
                   for c in line)


def label(text: object, limit: int = IMAGE_LABEL_CHARS) -> str:
    """``text`` safe as an image label: one line of at most ``limit`` printable characters
    (matplotlib draws it literally: math parsing is off wherever it is drawn)."""
    line = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def chapter_cells(cert: dict, chapters: list[str], chapter_of: dict[str, str]) -> dict:
    """chapter -> (worst verdict, its clauses "ID: note") from a certificate's clauses."""
    deviations = cert["backend"].get("deviations", {})
    by_chapter: dict[str, dict[str, str]] = {ch: {} for ch in chapters}
    for clause in cert["clauses"]:
        ch = chapter_of.get(clause["id"])
        if ch in by_chapter:
            by_chapter[ch][clause["id"]] = clause["verdict"]
    cells = {}
    for ch, found in by_chapter.items():
        worst = verdicts.chapter_verdict(found) or "not-run"
        notes = [f"{c}: {deviations.get(c, 'declared')}" if v == "deviation" else c
                 for c, v in found.items() if v == worst]
        cells[ch] = (worst, notes)
    return cells


def read_rows(directory: pathlib.Path) -> Board:
    """The verified certificates of ``directory`` as a :class:`Board`; the certificates of a draft
    since released are listed apart (digest verified; their clauses cannot be checked)."""
    spec = load_spec()
    testable = [ch for ch in spec.chapters
                if any(c.chapter == ch.id and c.testable for c in spec.clauses)]
    core = [ch.id for ch in testable if not coverage.is_optional(ch.title)]
    optional = [ch.id for ch in testable if coverage.is_optional(ch.title)]
    chapter_of = {c.id: c.chapter for c in spec.clauses}
    rows, labels, superseded, profiles, devices, issued = [], set(), [], set(), set(), []
    for path in sorted(directory.glob("*.json")):
        try:
            cert = certificate.verify(certificate.loads(path.read_bytes()))
            if certificate.superseded_draft(cert):
                superseded.append(Superseded(cert["backend"]["name"],
                                             certificate.spec_label(cert["spec"]), cert["issued"],
                                             path.with_suffix(".md").name))
                continue
            certificate.check_consistency(cert)
        except certificate.CertificateError as exc:
            raise usage.UsageError(f"{path}: not a valid certificate: {usage.one_line(exc)}") \
                from None
        b = cert["backend"]
        labels.add(certificate.spec_label(cert["spec"]))
        profiles.add(cert["hypothesis"]["profile"])
        devices.update(cert["environment"]["devices"])
        issued.append(cert["issued"][:10])
        rows.append(Row(b["name"], f"{b['framework']} {b['framework_version']}",
                        cert["summary"]["verdict"], path.with_suffix(".md").name,
                        chapter_cells(cert, core + optional, chapter_of), coverage.of(cert),
                        inputs_of(cert)))
    rows.sort(key=lambda r: (r.library.casefold(), r.name.casefold()))
    # a chapter none of the certificates' versions has (SINK for certificates of 1.2) is left out
    issued_chapters = {ch for r in rows for ch, cell in r.cells.items() if cell[1]}
    if rows:
        core = [ch for ch in core if ch in issued_chapters]
        optional = [ch for ch in optional if ch in issued_chapters]
    return Board(rows, core, optional, ", ".join(sorted(labels)), sorted(profiles),
                 sorted(devices), (min(issued, default=""), max(issued, default="")), superseded)


def title(board: Board) -> str:
    """The scoreboard's title: spec version, profile, devices and dates of issue."""
    first, last = board.issued
    dates = first if first == last else f"{first} to {last}"
    return (f"mhaspec {board.label} conformance scoreboard: profile {', '.join(board.profiles)}, "
            f"{', '.join(d.upper() if d in ('cpu', 'cuda') else d for d in board.devices)}, "
            f"certificates issued {dates}")


def _cell(row: Row, ch: str, target: str) -> str:
    verdict, notes = row.cells[ch]
    word, meaning, _ = STYLE[verdict]
    tally = row.coverage.chapters.get(ch)
    text = word if verdict in ("not-implemented", "not-run") or tally is None else f"{word} {tally}"
    if ch in row.coverage.folded:
        text, notes = f"{text}{FOLD_MARK}", [*notes, FOLD_NOTE]
    tip = attribute(meaning + (": " + "; ".join(notes) if notes else ""))
    return f'[{text}]({target} "{tip}"){{ .mh-{verdict} }}'


def _grid(board: Board, chapters: list[str], link_dir: str) -> list[str]:
    lines = ["| implementation | " + " | ".join(f"[{ch}](spec/index.md#{ch})" for ch in chapters)
             + " |", "|---|" + "---|" * len(chapters)]
    for row in board.rows:
        target = f"{link_dir}/{quote(row.markdown)}"
        lines.append(f"| [{md_text(row.name)}]({target}) | "
                     + " | ".join(_cell(row, ch, target) for ch in chapters) + " |")
    return lines


def markdown(board: Board, link_dir: str, image: str) -> str:
    """The scoreboard section: the image with its title (click to enlarge), the coverage table,
    the core and the optional chapters as two grids linked to the certificates, the legend, and
    the certificates of a draft since released, listed to be re-issued."""
    heading = title(board)
    core = max((r.coverage.core.testable for r in board.rows), default=0)
    shown = md_text(heading)
    lines = [f"[![{shown}: one row per implementation, one column per chapter]({image})]"
             f'({image} "{attribute(heading)}: open full size"){{ .mh-scoreboard }}', "",
             f"*{shown}. Click the picture to open it full size.*", "",
             "### How much of the specification each implementation was certified on", "",
             f"A clause is certified when it passed or deviates as declared (dev.). *Core* is the "
             f"{core} testable clauses every implementation of its operations must meet; an "
             "*optional chapter* (a conformance level of its own, like an extension of the Array "
             "API standard) counts when every clause in it is certified.", "",
             "| implementation | library | verdict | testable clauses certified | core | "
             "optional chapters attained |", "|---|---|---|---|---|---|"]
    for row in board.rows:
        cov = row.coverage
        dev = f" ({cov.deviations} dev.)" if cov.deviations else ""
        optional = [coverage.chapter_label(cov, ch) for ch in cov.levels if ch != "core"]
        target = f"{link_dir}/{quote(row.markdown)}"
        lines.append(f"| [{md_text(row.name)}]({target}) | "
                     f"{md_text(row.library)} | {row.verdict} | "
                     f"{cov.certified} of {cov.testable}{dev} | {cov.core.certified} of "
                     f"{cov.core.testable} | "
                     f"{', '.join(optional) or 'none'} |")
    lines += ["", "Inputs: " + "; ".join(
        f"{md_text(row.name)} ({md_text(row.inputs)})" for row in board.rows) + ". The certify "
        "profile draws 100 cases a test from a recorded seed (an auditor re-runs them with "
        "`mhaspec audit`); the ci profile runs the fixed, derandomized cases CI runs."]
    legend = "; ".join(f"**{word}**: {meaning}" for key, (word, meaning, _) in STYLE.items()
                       if key != "stale-deviation")
    lines += ["", f"Each cell is the worst verdict of the chapter's clauses and how many of its "
                  f"testable clauses were certified ({legend}). Click a cell for the certificate "
                  "(every clause, its runs and the declared deviations); hover for the clauses "
                  f"behind the word. {FOLD_MARK}: {FOLD_NOTE}.", "", "### Core chapters", "",
              *_grid(board, board.core, link_dir), "", "### Optional chapters", "",
              *_grid(board, board.optional, link_dir)]
    if board.superseded:
        lines += ["", "Not in the grid: certificates issued against a draft that has since been "
                      "released, kept as the record of their runs until they are re-issued "
                      "(`mhaspec certify NAME --profile ci`): "
                  + "; ".join(f"[{md_text(s.name)}]({link_dir}/{quote(s.markdown)}) "
                              f"({s.label}, issued {md_text(s.issued[:10])})"
                              for s in board.superseded) + "."]
    lines += ["", "Regenerate with `mhaspec scoreboard` (from the certificates) or `mhaspec "
                  "scoreboard --certify all` (certify every implementation this machine can run "
                  "first).", ""]
    return "\n".join(lines)


def render_image(board: Board, path: pathlib.Path) -> None:
    """The grid as an SVG (or PNG, by ``path``'s suffix): its title on top, implementations down,
    the core chapters then the optional ones across, each cell coloured and labelled with its
    word's first letters and its count; text as paths, no date, so a re-render is identical."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    gap = 0.4
    columns = [(j, ch) for j, ch in enumerate(board.core)] + [
        (len(board.core) + gap + j, ch) for j, ch in enumerate(board.optional)]
    width = len(board.chapters) + gap + 1.6
    with plt.rc_context({"svg.hashsalt": "mhaspec-scoreboard", "svg.fonttype": "path"}):
        fig, ax = plt.subplots(figsize=(1.9 + 0.5 * width, 1.7 + 0.36 * len(board.rows)))
        for i, row in enumerate(board.rows):
            for x, ch in columns:
                verdict = row.cells[ch][0]
                tally = row.coverage.chapters.get(ch)
                short = {"not-implemented": "n/c", "not-run": "–"}.get(verdict, str(tally))
                short += FOLD_MARK if ch in row.coverage.folded else ""
                ax.add_patch(Rectangle((x, i), 1, 1, facecolor=STYLE[verdict][2],
                                       edgecolor="#9e9e9e"))
                ax.text(x + 0.5, i + 0.5, short, ha="center", va="center", fontsize=8,
                        parse_math=False)
            x = len(board.chapters) + gap
            ax.text(x + 0.15, i + 0.5, f"{row.coverage.certified}/{row.coverage.testable}",
                    ha="left", va="center", fontsize=9, fontweight="bold", parse_math=False)
        ax.set_xlim(0, width)
        ax.set_ylim(len(board.rows), 0)
        ax.set_xticks([x + 0.5 for x, _ in columns] + [len(board.chapters) + gap + 0.8],
                      [ch for _, ch in columns] + ["clauses"], rotation=45, ha="left", fontsize=9,
                      parse_math=False)
        ax.xaxis.tick_top()
        ax.set_yticks([i + 0.5 for i in range(len(board.rows))],
                      [f"{label(r.name)}\n{label(r.library)}" for r in board.rows], fontsize=8,
                      parse_math=False)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.text(len(board.core) / 2, len(board.rows) + 0.15, "core chapters", ha="center",
                va="top", fontsize=8, style="italic", parse_math=False)
        ax.text(len(board.core) + gap + len(board.optional) / 2, len(board.rows) + 0.15,
                "optional chapters", ha="center", va="top", fontsize=8, style="italic",
                parse_math=False)
        shown = ("pass", "deviation", "fail", "not-implemented", "not-run")
        ax.legend(handles=[Patch(facecolor=STYLE[k][2], edgecolor="#9e9e9e",
                                 label=f"{STYLE[k][0]}: {STYLE[k][1]}") for k in shown],
                  loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=3, fontsize=8,
                  frameon=False)
        fig.suptitle(label(title(board), limit=160), fontsize=11, fontweight="bold", x=0.02,
                     ha="left", parse_math=False)
        fig.text(0.02, 0.005, "cell: testable clauses certified / in the chapter (n/c: capability "
                 "not claimed); clauses: of the whole spec", fontsize=8, parse_math=False)
        fig.tight_layout(rect=(0, 0.02, 1, 0.97))
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None, dpi=150)
        plt.close(fig)


def splice(page: str, section: str) -> str:
    """``page`` with the text between the scoreboard markers replaced by ``section``."""
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(page):
        raise usage.UsageError(f"the page has no '{START}' ... '{END}' markers")
    return pattern.sub(lambda _: f"{START}\n{section}\n{END}", page)


def certifiable() -> list[str]:
    """Registered backends that load here and have at least one available device."""
    return [name for name, backend in loadable().backends.items()
            if any(why is None for why in backend.devices().values())]


def main(argv: list[str] | None = None) -> int:
    parser = usage.ArgumentParser(prog="mhaspec scoreboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--certificates", type=pathlib.Path, default=DEFAULT_DIR,
                        help=f"folder of the published certificates to read (default {DEFAULT_DIR}; "
                             f"mhaspec certify writes to certificates/ unless --output-dir says)")
    parser.add_argument("--page", type=pathlib.Path, default=DEFAULT_PAGE,
                        help=f"page whose scoreboard markers are filled (default {DEFAULT_PAGE})")
    parser.add_argument("--image", type=pathlib.Path, default=DEFAULT_IMAGE,
                        help=f"image of the grid to write (default {DEFAULT_IMAGE})")
    parser.add_argument("--certify", nargs="+", default=[], metavar="NAME",
                        help="certify these backends first (ci profile); 'all': every one that "
                             "runs here")
    args = parser.parse_args(argv)
    names = certifiable() if args.certify == ["all"] else args.certify
    for name in names:
        subprocess.run([sys.executable, "-m", "mhaspec.cli", "certify", name, "--profile", "ci",
                        "--output-dir", str(args.certificates)], check=False)
    board = read_rows(args.certificates)
    if not board.rows:
        raise usage.UsageError(f"no certificates in {args.certificates}")
    image = pathlib.Path(args.image)
    render_image(board, image)
    page_dir = args.page.resolve().parent
    section = markdown(board, _relative(args.certificates.resolve(), page_dir),
                       _relative(image.resolve(), page_dir))
    args.page.write_text(splice(args.page.read_text(encoding="utf-8"), section), encoding="utf-8")
    print(f"wrote {args.page} and {image}: {len(board.rows)} implementations")
    return 0


def _relative(path: pathlib.Path, start: pathlib.Path) -> str:
    return pathlib.Path(os.path.relpath(path, start)).as_posix()


if __name__ == "__main__":
    raise SystemExit(main())
