"""Every relative link of README.md and docs/ points at a file of the repository, and every ``#anchor`` at a heading
of its target page (GitHub's heading slugs), so that moving a results section cannot leave a dead link."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (word characters, '-' and '_'
    kept), spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path):
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if not re.match(r"^(https?:|mailto:)", target):
            yield target


def test_slug_matches_github():
    assert slug("The order within a round (2026-12-01, `norms_inductor_aa`)") == \
        "the-order-within-a-round-2026-12-01-norms_inductor_aa"
    assert slug("Multi-CTA norm fusion, MXNorm, FlashNormAttention") == "multi-cta-norm-fusion-mxnorm-flashnormattention"


def test_checker_catches_a_dead_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n[ok](#title) [bad](#nope) [file](missing.md)\n")
    assert "#nope" in list(links(page)) and "title" in anchors(page) and "nope" not in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    dead = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            dead.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            dead.append(f"{target}: no heading with that anchor")
    assert not dead, f"{page.relative_to(ROOT)}: " + "; ".join(dead)
