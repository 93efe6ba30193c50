"""griffe extension: Sphinx cross-reference roles in docstrings become links in the API reference.

mutor's docstrings are Google style, and refer to other objects the Sphinx way (``:class:`~mutor.MuToRModel```,
``:func:`load_recipe```, ``:meth:`train```), which mkdocstrings would print as they are. This extension rewrites
each role into an optional cross-reference of mkdocs-autorefs: a link where the target is documented on the site,
the name in code type where it is not (no warning either way). ``~`` keeps only the last part of the name, as in
Sphinx; a name without a module is looked up from the object whose docstring it is in.
"""

from __future__ import annotations

import html
import re

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const):`(?P<target>[^`]+)`")


def _identifier(obj: griffe.Object, name: str) -> str:
    """The full path of ``name`` as seen from ``obj`` (``name`` itself when it cannot be resolved)."""
    if name.startswith("mutor.") or name == "mutor":
        return name
    head, _, rest = name.lstrip(".").partition(".")
    scope = obj
    while scope is not None:
        try:
            path = scope.resolve(head)
        except Exception:       # griffe's NameResolutionError, or a scope that cannot resolve at all
            scope = scope.parent
            continue
        return f"{path}.{rest}" if rest else path
    return name


def _rewrite(obj: griffe.Object, text: str) -> str:
    def link(m: re.Match) -> str:
        target = m.group("target").strip()
        title = None
        if "<" in target and target.endswith(">"):           # :class:`title <path>`
            title, target = target[:-1].split("<", 1)
            title, target = title.strip(), target.strip()
        short = target.startswith("~")
        target = target.lstrip("~")
        shown = title or (target.rsplit(".", 1)[-1] if short else target)
        ident = _identifier(obj, target)
        return (f'<autoref identifier="{html.escape(ident)}" optional><code>{html.escape(shown)}</code>'
                f"</autoref>")

    return _ROLE.sub(link, text)


class SphinxRoles(griffe.Extension):
    """Rewrites Sphinx roles in every docstring once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs) -> None:
        if obj.is_alias or obj.docstring is None or ":" not in obj.docstring.value:
            return
        obj.docstring.value = _rewrite(obj, obj.docstring.value)
