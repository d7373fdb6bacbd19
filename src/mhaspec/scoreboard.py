"""``mhaspec scoreboard``: the ecosystem conformance table, from the certificates.

Reads every certificate ``<dir>/*.json`` (default ``docs/certificates``; each is verified: schema,
digest, consistency), and renders

* a chapter x implementation grid of symbols, one row per implementation with its library and
  version and its verdict; each cell links to the implementation's certificate (its Markdown form,
  where every clause is listed) and its tooltip names the clauses behind the symbol;
* the same grid as an image (matplotlib, ``docs/assets/scoreboard.png``),

into ``docs/matrix.md`` between the markers ``<!-- scoreboard:start -->`` and
``<!-- scoreboard:end -->``. ``--certify NAME ...`` first (re)issues those certificates with
``mhaspec certify NAME --profile ci --output-dir <dir>``; ``--certify all`` does it for every
registered backend that loads and has a device here. A chapter's symbol is the worst verdict of its
clauses (fail, deviation, pass, not implemented; "not run" when none ran).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import NamedTuple

from mhaspec import certificate, usage
from mhaspec.backends import BackendLoadError, load_backend, registered_backends
from mhaspec.conformance import verdicts
from mhaspec.spec import load as load_spec

DEFAULT_DIR = pathlib.Path("docs/certificates")
DEFAULT_PAGE = pathlib.Path("docs/matrix.md")
DEFAULT_IMAGE = pathlib.Path("docs/assets/scoreboard.png")
START, END = "<!-- scoreboard:start -->", "<!-- scoreboard:end -->"

#: chapter verdict -> (symbol, word, colour of the image cell)
STYLE = {
    "pass": ("✅", "pass", "#4caf50"),
    "deviation": ("🟡", "declared deviation", "#ffc107"),
    "stale-deviation": ("❌", "stale deviation (declared, but it conforms)", "#e53935"),
    "fail": ("❌", "fail", "#e53935"),
    "not-implemented": ("➖", "not implemented (capability not claimed)", "#e0e0e0"),
    "not-run": ("·", "not run", "#ffffff"),
}


class Row(NamedTuple):
    """One certified implementation: its name, library and version, verdict, the certificate's
    Markdown file name, and chapter id -> (verdict, the clauses behind it)."""

    name: str
    library: str
    verdict: str
    markdown: str
    cells: dict


def _link_title(text: str) -> str:
    """``text`` safe inside a Markdown link title: double quotes become single ones, parentheses
    HTML entities (an unbalanced one, e.g. in a cut-off note, would end the link early)."""
    return text.replace('"', "'").replace("(", "&#40;").replace(")", "&#41;")


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


class Superseded(NamedTuple):
    """A certificate issued against a draft that has since been released (not in the grid)."""

    name: str
    label: str
    issued: str
    markdown: str


def read_rows(directory: pathlib.Path) -> tuple[list[Row], list[str], str, list[Superseded]]:
    """The verified certificates of ``directory`` as rows, the chapter ids, the spec label, and the
    certificates of a draft since released (digest verified; their clauses cannot be checked)."""
    spec = load_spec()
    chapters = [ch.id for ch in spec.chapters
                if any(c.chapter == ch.id and c.testable for c in spec.clauses)]
    chapter_of = {c.id: c.chapter for c in spec.clauses}
    rows, labels, superseded = [], set(), []
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
        rows.append(Row(b["name"], f"{b['framework']} {b['framework_version']}",
                        cert["summary"]["verdict"], path.with_suffix(".md").name,
                        chapter_cells(cert, chapters, chapter_of)))
    return rows, chapters, ", ".join(sorted(labels)), superseded


def markdown(rows: list[Row], chapters: list[str], spec_label: str, link_dir: str,
             image: str, superseded: list[Superseded] = ()) -> str:
    """The scoreboard section: legend, grid (cells linked to the certificates), image, and the
    certificates of a draft since released, listed to be re-issued."""
    legend = "; ".join(f"{sym} {word}" for key, (sym, word, _) in STYLE.items()
                       if key != "stale-deviation")
    lines = [f"Certified against mhaspec {spec_label}, `ci` profile, CPU. {legend}. A cell is the "
             "worst verdict of the chapter's clauses; click it for the certificate (every clause, "
             "its runs and the declared deviations), hover for the clauses behind the symbol.", "",
             "| implementation | library | verdict | "
             + " | ".join(f"[{ch}](spec/index.md#{ch})" for ch in chapters) + " |",
             "|---|---|---|" + "---|" * len(chapters)]
    for row in rows:
        target = f"{link_dir}/{row.markdown}"
        cells = []
        for ch in chapters:
            verdict, notes = row.cells[ch]
            title = _link_title(STYLE[verdict][1] + (": " + "; ".join(notes) if notes else ""))
            cells.append(f'[{STYLE[verdict][0]}]({target} "{title}")')
        lines.append(f"| [`{row.name}`]({target}) | {row.library} | {row.verdict} | "
                     + " | ".join(cells) + " |")
    if superseded:
        lines += ["", "Not in the grid: certificates issued against a draft that has since been "
                      "released, kept as the record of their runs until they are re-issued "
                      "(`mhaspec certify NAME --profile ci`): "
                  + "; ".join(f"[`{s.name}`]({link_dir}/{s.markdown}) ({s.label}, issued "
                              f"{s.issued[:10]})" for s in superseded) + "."]
    lines += ["", f"![The scoreboard as an image: one row per implementation, one column per "
                  f"chapter]({image})", "",
              "Regenerate with `mhaspec scoreboard` (from the certificates) or `mhaspec scoreboard "
              "--certify all` (certify every implementation this machine can run first).", ""]
    return "\n".join(lines)


def render_image(rows: list[Row], chapters: list[str], path: pathlib.Path) -> None:
    """The grid as a PNG: coloured cells, implementations down, chapters across."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    fig, ax = plt.subplots(figsize=(2.6 + 0.62 * len(chapters), 0.9 + 0.36 * len(rows)), dpi=150)
    for i, row in enumerate(rows):
        for j, ch in enumerate(chapters):
            verdict = row.cells[ch][0]
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=STYLE[verdict][2], edgecolor="#9e9e9e"))
            ax.text(j + 0.5, i + 0.5, verdicts.SYMBOL.get(verdict, ""), ha="center", va="center",
                    fontsize=6)
    ax.set_xlim(0, len(chapters))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(chapters))], chapters, rotation=45, ha="left",
                  fontsize=7)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(rows))],
                  [f"{r.name} ({r.library})" for r in rows], fontsize=7)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    shown = [k for k in ("pass", "deviation", "fail", "not-implemented", "not-run")]
    ax.legend(handles=[Patch(facecolor=STYLE[k][2], edgecolor="#9e9e9e", label=STYLE[k][1])
                       for k in shown], loc="upper center", bbox_to_anchor=(0.5, -0.02),
              ncol=3, fontsize=6, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def splice(page: str, section: str) -> str:
    """``page`` with the text between the scoreboard markers replaced by ``section``."""
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(page):
        raise usage.UsageError(f"the page has no '{START}' ... '{END}' markers")
    return pattern.sub(lambda _: f"{START}\n{section}\n{END}", page)


def certifiable() -> list[str]:
    """Registered backends that load here and have at least one available device."""
    names = []
    for name in sorted(registered_backends()):
        try:
            backend = load_backend(name)
        except BackendLoadError:
            continue
        if any(why is None for why in backend.devices().values()):
            names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = usage.ArgumentParser(prog="mhaspec scoreboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--certificates", type=pathlib.Path, default=DEFAULT_DIR)
    parser.add_argument("--page", type=pathlib.Path, default=DEFAULT_PAGE)
    parser.add_argument("--image", type=pathlib.Path, default=DEFAULT_IMAGE)
    parser.add_argument("--certify", nargs="+", default=[], metavar="NAME",
                        help="certify these backends first (ci profile); 'all': every one that "
                             "runs here")
    args = parser.parse_args(argv)
    names = certifiable() if args.certify == ["all"] else args.certify
    for name in names:
        subprocess.run([sys.executable, "-m", "mhaspec.cli", "certify", name, "--profile", "ci",
                        "--output-dir", str(args.certificates)], check=False)
    rows, chapters, label, superseded = read_rows(args.certificates)
    if not rows:
        raise usage.UsageError(f"no certificates in {args.certificates}")
    image = pathlib.Path(args.image)
    render_image(rows, chapters, image)
    page_dir = args.page.resolve().parent
    section = markdown(rows, chapters, label,
                       _relative(args.certificates.resolve(), page_dir),
                       _relative(image.resolve(), page_dir), superseded)
    args.page.write_text(splice(args.page.read_text(encoding="utf-8"), section), encoding="utf-8")
    print(f"wrote {args.page} and {image}: {len(rows)} implementations")
    return 0


def _relative(path: pathlib.Path, start: pathlib.Path) -> str:
    return pathlib.Path(os.path.relpath(path, start)).as_posix()


if __name__ == "__main__":
    raise SystemExit(main())
