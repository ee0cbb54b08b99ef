"""Static HTML for the feature dashboard: an index table sortable by any column and one page per
feature. Self-contained (inline CSS, JavaScript and SVG; no CDN, no server): it opens from disk
offline."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from sae_lens_bae.dashboard.pages import FeaturePage

__all__ = ["feature_html", "feature_file", "histogram_svg", "index_html"]

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 72em; }
table { border-collapse: collapse; } th, td { padding: 0.25em 0.7em; text-align: right; }
th { cursor: pointer; border-bottom: 2px solid #888; user-select: none; }
td.text, th.text { text-align: left; } tr:nth-child(even) { background: #f4f4f4; }
.context { font-family: ui-monospace, monospace; white-space: pre-wrap; padding: 0.2em 0; }
mark { background: #ffb347; font-weight: bold; padding: 0 0.1em; }
.magnitude { color: #666; display: inline-block; width: 5em; }
.lens { display: inline-block; vertical-align: top; margin-right: 3em; }
"""

SORT_SCRIPT = """
document.querySelectorAll('th').forEach((th, column) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0];
  const up = th.dataset.order !== 'up'; th.dataset.order = up ? 'up' : 'down';
  const key = row => { const v = row.cells[column].dataset.value;
                       return v === '' ? -Infinity : Number(v); };
  [...body.rows].sort((a, b) => up ? key(a) - key(b) : key(b) - key(a))
    .forEach(row => body.appendChild(row));
}));
"""

COLUMNS = (
    ("feature", "feature", "d"),
    ("records", "records", "d"),
    ("frequency", "frequency", ".4f"),
    ("rarity", "rarity min(p, 1-p)", ".4f"),
    ("burstiness", "mean magnitude", ".3f"),
    ("score", "ComSem score", ".2f"),
)


def feature_file(feature: int) -> str:
    """The page of ``feature``, relative to the index."""
    return f"features/{feature:06d}.html"


def _document(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>\n{body}\n</body></html>\n"
    )


def index_html(pages: Sequence[FeaturePage], title: str) -> str:
    """The index: one row per feature, linked to its page; click a header to sort."""
    head = "".join(f"<th>{escape(label)}</th>" for _, label, _ in COLUMNS)
    rows = []
    for page in pages:
        cells = []
        for name, _, spec in COLUMNS:
            value = getattr(page, name)
            shown = "-" if value is None else format(value, spec)
            if name == "feature":
                shown = f'<a href="{feature_file(page.feature)}">{shown}</a>'
            cells.append(f'<td data-value="{"" if value is None else value}">{shown}</td>')
        explanation = escape(page.explanation or "")
        rows.append(f'<tr>{"".join(cells)}<td class="text">{explanation}</td></tr>')
    table = (
        f'<table id="features"><thead><tr>{head}<th class="text">explanation</th></tr>'
        f"</thead><tbody>\n{chr(10).join(rows)}\n</tbody></table>"
    )
    body = (
        f"<h1>{escape(title)}</h1><p>{len(pages)} features. Click a column to sort.</p>"
        f"{table}<script>{SORT_SCRIPT}</script>"
    )
    return _document(title, body)


def histogram_svg(
    values: Sequence[float], bins: int = 30, width: int = 480, height: int = 160
) -> str:
    """An inline SVG histogram of ``values`` (bar per bin, the range written under it)."""
    low, high = min(values), max(values)
    span = high - low or 1.0
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / span * bins), bins - 1)] += 1
    tallest = max(counts)
    bar = width / bins
    rects = "".join(
        f'<rect x="{i * bar:.1f}" y="{height - 20 - (c / tallest) * (height - 30):.1f}" '
        f'width="{bar - 1:.1f}" height="{(c / tallest) * (height - 30):.1f}" fill="#4a7ab7">'
        f"<title>{c}</title></rect>"
        for i, c in enumerate(counts)
    )
    labels = (
        f'<text x="0" y="{height - 4}" font-size="11">{low:.3g}</text>'
        f'<text x="{width}" y="{height - 4}" font-size="11" text-anchor="end">'
        f"{high:.3g}</text>"
    )
    return (
        f'<svg class="histogram" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">{rects}{labels}</svg>'
    )


def _lens_table(title: str, tokens: list[tuple[str, float]]) -> str:
    rows = "".join(
        f'<tr><td class="text">{escape(repr(t))}</td><td>{v:+.3f}</td></tr>' for t, v in tokens
    )
    return f'<div class="lens"><h3>{title}</h3><table>{rows}</table></div>'


def feature_html(page: FeaturePage, magnitude: str) -> str:
    """A feature's page: its numbers, explanation, histogram, logit lens and contexts."""
    facts = [
        f"{page.records} records ({page.frequency:.4f} of the tokens)",
        f"mean {magnitude} {page.burstiness:.3f}",
    ]
    if page.rarity is not None:
        facts.append(f"rarity min(p, 1-p) {page.rarity:.4f}")
    parts = [
        f'<p><a href="../index.html">all features</a></p><h1>Feature {page.feature}</h1>',
        f"<p>{'; '.join(facts)}</p>",
    ]
    if page.explanation is not None:
        score = "" if page.score is None else f" (ComSem score {page.score:.2f})"
        parts.append(f'<p class="explanation"><b>ComSem:</b> {escape(page.explanation)}{score}</p>')
    if len(set(page.magnitudes)) > 1:
        histogram = histogram_svg(page.magnitudes)
    else:  # a BAE bit's burstiness takes one value wherever it is in its rare state
        histogram = f"<p>every record at {page.magnitudes[0]:.4f}</p>"
    parts.append(f"<h2>{escape(magnitude)} of its records</h2>{histogram}")
    if page.promoted is not None and page.suppressed is not None:
        parts.append(
            "<h2>Logit lens (decoder row through the unembedding)</h2>"
            + _lens_table("promotes", page.promoted)
            + _lens_table("suppresses", page.suppressed)
        )
    contexts = "".join(
        f'<div class="context"><span class="magnitude">{c.magnitude:.3f}</span>'
        f"{escape(c.before)}<mark>{escape(c.token)}</mark>{escape(c.after)}</div>"
        for c in page.contexts
    )
    parts.append(f"<h2>Top-activating contexts</h2>{contexts}")
    return _document(f"Feature {page.feature}", "\n".join(parts))
