"""MkDocs hooks for the mhaspec site (registered in ``mkdocs.yml``).

* The site name carries the spec version read from ``spec/clauses.toml``, so it is on every page.
* ``spec/index.md`` is generated from ``spec/clauses.toml`` at build time; every committed
  rendering ``spec/mhaspec-<version>.md`` becomes the frozen page ``spec/<version>.md``.
* LaTeX between ``$...$`` / ``$$...$$`` becomes MathML at build time (``latex2mathml``), so the
  equations render offline with no script and no CDN. Code spans and blocks are left alone.
* ``<!-- mhaspec:if-exists PATH -->A<!-- mhaspec:else -->B<!-- mhaspec:end -->`` keeps A when
  ``docs/PATH`` exists (``{{content}}`` in A is replaced by the file's text) and B otherwise, so
  the strict build passes whether or not generated files are present. A generated page
  (``generated/*.md``) is included through :func:`mhaspec.generated.include`: under a line naming
  its spec version, or collapsed under a warning when that is not the current version.
* ``build/docs-api/`` is rebuilt as a tree of symlinks that lays the packages out as they are
  imported (``[tool.setuptools] package-dir`` maps ``mhaspec.backends`` to ``backends/`` and so
  on), so mkdocstrings can read the API reference statically.
* ``<!-- mhaspec:clause ID -->`` quotes a clause from the table; ``<!-- mhaspec:versions -->``
  lists the rendered versions.
"""

from __future__ import annotations

import html
import logging
import pathlib
import re
import shutil
import tomllib

import mhaspec.spec as spec_pkg
from latex2mathml.converter import convert as latex_to_mathml
from mhaspec import generated
from mhaspec.spec import load
from mhaspec.spec.render import annotate_errata, render_errata, render_markdown

SPEC_DIR = pathlib.Path(spec_pkg.__file__).parent
RENDERED = re.compile(r"mhaspec-(?P<version>\d+(?:\.\d+)*)\.md$")

_CODE_OR_MATH = re.compile(
    r"(?P<fence>^(?P<ticks>```+|~~~+)[^\n]*\n.*?^(?P=ticks)[ \t]*$)"  # fenced code block
    r"|(?P<code>(?P<bt>`+)(?!`).+?(?<!`)(?P=bt)(?!`))"                # inline code span
    r"|\$\$(?P<display>.+?)\$\$"                                      # display math
    r"|(?<![\\$\w])\$(?P<inline>[^\s$](?:[^$\n]*?[^\s$\\])?)\$(?![\w$])",  # inline math
    re.S | re.M)
_TOKEN = "MHASPECMATH{}X"
_TOKEN_RE = re.compile(r"(<p>)?MHASPECMATH(\d+)X(</p>)?")
_IF_EXISTS = re.compile(
    r"<!--\s*mhaspec:if-exists\s+(?P<path>\S+)\s*-->(?P<yes>.*?)"
    r"<!--\s*mhaspec:else\s*-->(?P<no>.*?)<!--\s*mhaspec:end\s*-->", re.S)
_CLAUSE = re.compile(r"<!--\s*mhaspec:clause\s+(?P<id>[A-Z]+-\d+)\s*-->")
_VERSIONS = re.compile(r"<!--\s*mhaspec:versions\s*-->")
_ERRATA = re.compile(r"<!--\s*mhaspec:errata\s*-->")

_HEADING_WITH_MATH = re.compile(r"^#{1,6} [^\n]*\$", re.M)
log = logging.getLogger("mkdocs.hooks.mhaspec_docs")

_math_by_page: dict[str, list[tuple[str, bool]]] = {}


def rendered_versions() -> list[tuple[str, pathlib.Path]]:
    """(version, path) of every committed rendering, oldest first; the current version is left
    out while it is a draft (only released versions are published as frozen pages)."""
    current = load()
    found = []
    for path in SPEC_DIR.glob("mhaspec-*.md"):
        m = RENDERED.search(path.name)
        if m and not (current.is_draft and m["version"] == current.version):
            found.append((m["version"], path))
    return sorted(found, key=lambda vp: tuple(int(p) for p in vp[0].split(".")))


def _after_title(text: str, insert: str) -> str:
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{insert}\n{rest}"


_CLAUSE_HEADING = re.compile(r"^### (?P<id>[A-Z]+-[0-9]+): .*\{#(?P=id)\}$", re.M)


def with_citations(text: str, version: str, frozen: str | None) -> str:
    """``text`` (a rendering of spec ``version``) with a citation line under each clause heading:
    the text to cite and, where ``frozen`` (the frozen page of that version, relative to this one)
    is given, the clause's link there, which keeps its meaning when the next version is out."""
    def cite(m: re.Match) -> str:
        link = (f" · permanent link: [`spec/{version}/#{m['id']}`]({frozen}#{m['id']})"
                if frozen else "")
        return (f"{m.group(0)}\n\nCite as *mhaspec {version}, clause {m['id']}*{link}\n"
                f"{{: .mh-cite }}")
    return _CLAUSE_HEADING.sub(cite, text)


def current_spec_page() -> str:
    spec = load()
    released = any(v == spec.version for v, _ in rendered_versions())
    note = (f"!!! info \"{spec.name} {spec.version}: the current version\"\n"
            f"    This page is generated from `spec/clauses.toml` when the site is built. Every clause\n"
            f"    heading carries its id as the HTML anchor, so `spec/#MASK-9` lands on clause MASK-9;\n"
            f"    that link follows the current version. To cite a clause, use the citation line\n"
            f"    under its heading"
            + (f" and its permanent link into the frozen page `spec/{spec.version}/`" if released
               else "") +
            f". Earlier and frozen renderings are listed under [Versions](../versions.md).\n")
    text = with_citations(annotate_errata(render_markdown(spec), spec, link="../errata.md"),
                          spec.version,
                          f"{spec.version}.md" if released else None)
    return _after_title(text, note)


def frozen_spec_page(version: str, path: pathlib.Path) -> str:
    note = (f"!!! note \"Frozen rendering of mhaspec {version}\"\n"
            f"    This is the released text of version {version} exactly as committed in\n"
            f"    `spec/{path.name}`. A released version is never edited in place: see the\n"
            f"    [errata policy](../errata.md). The current version is [here](index.md).\n")
    if any(e.version == version for e in load().errata):
        note += (f"\n    Informative errata of {version} (notes that change no requirement) are\n"
                 f"    listed on the [errata page](../errata.md#errata-of-released-versions).\n")
    text = with_citations(path.read_text(encoding="utf-8"), version, f"{version}.md")
    return _after_title(text, note)


def build_api_source_tree(root: pathlib.Path) -> pathlib.Path:
    """Symlink tree ``<root>/build/docs-api/<package path>`` from pyproject's package-dir."""
    with open(root / "pyproject.toml", "rb") as fh:
        package_dir = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    out = root / "build" / "docs-api"
    shutil.rmtree(out, ignore_errors=True)
    for name, rel in sorted(package_dir.items(), key=lambda kv: kv[0].count(".")):
        source = (root / rel).resolve()
        target = out.joinpath(*name.split("."))
        if "." not in name:   # a top-level package: a real directory of links to its files
            target.mkdir(parents=True)
            for child in source.iterdir():
                if child.name != "__pycache__":
                    (target / child.name).symlink_to(child)
        else:                 # a mapped subpackage: one link to its directory
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(source, target_is_directory=True)
    return out


# mkdocstrings sets up its handler (and its search paths) before any hook's on_config runs, so the
# tree is written when MkDocs loads this file, which happens while it reads mkdocs.yml.
build_api_source_tree(pathlib.Path(__file__).resolve().parents[2])


# -- MkDocs events ---------------------------------------------------------------------------

def on_config(config, **kwargs):
    spec = load()
    config.site_name = f"{spec.name} {spec.version}" + (" (draft)" if spec.is_draft else "")
    config.copyright = (f"{spec.name} specification, version {spec.version}. "
                        f"Cite a clause as \u201c{spec.name} {spec.version}, clause MASK-3\u201d.")
    config.extra["spec_version"] = spec.version
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "spec/index.md", content=current_spec_page()))
    for version, path in rendered_versions():
        files.append(File.generated(config, f"spec/{version}.md",
                                    content=frozen_spec_page(version, path)))
    return files


def _versions_table(page_src: str) -> str:
    spec = load()
    prefix = "../" * page_src.count("/")
    rows = ["| version | page | source |", "|---|---|---|",
            f"| {spec.version} ({'draft' if spec.is_draft else 'current'}) | "
            f"[spec/]({prefix}spec/index.md) | `spec/clauses.toml` |"]
    for version, path in reversed(rendered_versions()):
        rows.append(f"| {version} | [spec/{version}/]({prefix}spec/{version}.md) | `spec/{path.name}` |")
    return "\n".join(rows)


def _clause_quote(clause_id: str) -> str:
    spec = load()
    clause = spec.clause(clause_id)
    body = "\n".join(f"    {line}" if line else "" for line in clause.text.splitlines())
    return (f"!!! quote \"{spec.name} {spec.version}, clause {clause.id}: {clause.title}\"\n\n"
            f"{body}\n")


def on_page_markdown(markdown, page, config, files, **kwargs):
    docs_dir = pathlib.Path(config.docs_dir)

    def if_exists(m: re.Match) -> str:
        target = docs_dir / m["path"]
        if target.is_file():
            body = m["yes"]
            if "{{content}}" in body:
                text = target.read_text(encoding="utf-8")
                if target.parent.name == "generated" and target.suffix == ".md":
                    text = generated.include(text, load().version,
                                             generated.REGENERATE.get(target.name, "its generator"))
                body = body.replace("{{content}}", text)
            return body
        return m["no"]

    markdown = _IF_EXISTS.sub(if_exists, markdown)
    markdown = _CLAUSE.sub(lambda m: _clause_quote(m["id"]), markdown)
    markdown = _VERSIONS.sub(lambda m: _versions_table(page.file.src_uri), markdown)
    markdown = _ERRATA.sub(lambda m: render_errata(load()), markdown)

    without_fences = re.sub(r"^(```+|~~~+).*?^\1[ \t]*$", "", markdown, flags=re.S | re.M)
    for heading in _HEADING_WITH_MATH.findall(without_fences):
        log.warning("%s: math in a heading is not supported (it would break the anchor and the "
                    "table of contents): %r", page.file.src_uri, heading)

    stash: list[tuple[str, bool]] = []

    def math(m: re.Match) -> str:
        if m["fence"] is not None or m["code"] is not None:
            return m.group(0)
        display = m["display"] is not None
        stash.append(((m["display"] if display else m["inline"]).strip(), display))
        return _TOKEN.format(len(stash) - 1)

    markdown = _CODE_OR_MATH.sub(math, markdown)
    _math_by_page[page.file.src_uri] = stash
    return markdown


def _mathml(tex: str, display: str) -> str:
    """``tex`` as MathML, its source kept in ``alttext``."""
    mathml = latex_to_mathml(tex, display=display)
    return mathml.replace("<math ", f"<math alttext=\"{html.escape(tex)}\" ", 1)


def display_parts(tex: str) -> list[str]:
    """A display equation split at its top-level ``\\qquad`` (the spec's separator of equations
    written on one line), each part typeset on its own so that a narrow screen wraps them
    (``.mhaspec-math`` is a wrapping row) instead of cutting the line; one part when it has none."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(tex):
        if tex[i] == "{":
            depth += 1
        elif tex[i] == "}":
            depth -= 1
        elif depth == 0 and tex.startswith("\\qquad", i):
            parts.append(tex[start:i])
            start = i = i + len("\\qquad")
            continue
        i += 1
    parts.append(tex[start:])
    return [p.strip() for p in parts if p.strip()]


def on_page_content(html_text, page, config, files, **kwargs):
    stash = _math_by_page.pop(page.file.src_uri, [])

    def put_back(m: re.Match) -> str:
        tex, display = stash[int(m[2])]
        if display and m[1] and m[3]:
            parts = "".join(_mathml(part, "block") for part in display_parts(tex))
            return f'<div class="mhaspec-math">{parts}</div>'
        return f"{m[1] or ''}{_mathml(tex, 'block' if display else 'inline')}{m[3] or ''}"

    return _TOKEN_RE.sub(put_back, html_text)
