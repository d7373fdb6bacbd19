"""``python -m mhaspec.spec [DIR]``: write the rendered specification Markdown into DIR."""

import pathlib
import sys

from . import load
from .render import render_markdown, rendered_filename

spec = load()
target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).parent
(target / rendered_filename(spec)).write_text(render_markdown(spec), encoding="utf-8")
print(target / rendered_filename(spec))
