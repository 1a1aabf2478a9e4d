"""An nbconvert exporter whose pages load nothing from the network: ``jupyter nbconvert --to eagleforensics``.

nbconvert's stock ``lab`` template asks a CDN for require.js and MathJax (and mermaid and the
widget manager); offline those are failed requests, on an air-gapped cluster a hang. This
exporter is the lab template minus those blocks; plotly.js is already inline in our outputs
(``nbview.setup``). The report pipeline renders with it, and so can anyone converting an
executed notebook by hand (the ``nbconvert.exporters`` entry point, or the class's dotted name).
"""
from __future__ import annotations

from typing import Any

from jinja2 import DictLoader
from nbconvert import HTMLExporter
from traitlets import default

TEMPLATE_NAME = "eagleforensics_offline.html.j2"
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
"""


class OfflineHTMLExporter(HTMLExporter):
    """HTML from the lab template with every CDN script left out (require.js, MathJax, mermaid, widgets)."""

    export_from_notebook = "HTML (offline, eagleforensics)"

    @default("template_name")
    def _lab(self) -> str:
        return "lab"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        loaders = list(kwargs.pop("extra_loaders", None) or []) + [DictLoader({TEMPLATE_NAME: TEMPLATE})]
        super().__init__(*args, extra_loaders=loaders, **kwargs)
        self.template_file = TEMPLATE_NAME
