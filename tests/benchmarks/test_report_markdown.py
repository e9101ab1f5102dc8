"""Regenerating docs/benchmarks.md keeps the sections written by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import _report
from benchmarks._report import HAND_WRITTEN, keep_hand_written

DOCS_PAGE = Path(__file__).parents[2] / "docs" / "benchmarks.md"


def _without_hand_written(text: str) -> str:
    """``text`` as the generator writes it: the hand-written sections left out."""
    return "".join(body for _, body in _report._sections(text) if HAND_WRITTEN not in body)


def test_the_docs_page_marks_its_hand_written_sections() -> None:
    text = DOCS_PAGE.read_text()
    marked = [h for h, body in _report._sections(text) if HAND_WRITTEN in body]
    assert marked == [
        "etcd (side by side)",
        "Cost of TLS",
        "Groups and partitions (side by side with tooz)",
        "once vs SET NX PX",
    ]


def test_regenerating_the_docs_page_gives_it_back_unchanged() -> None:
    text = DOCS_PAGE.read_text()
    generated = _without_hand_written(text)
    assert "## Cost of TLS" not in generated
    assert keep_hand_written(generated, text) == text


def test_hand_written_sections_keep_their_place_among_new_figures() -> None:
    existing = (
        "# B\n\nold intro\n\n## One\n\nold 1\n\n"
        f"## Mine\n\n{HAND_WRITTEN}\n\nmine\n\n"
        f"## Also mine\n\n{HAND_WRITTEN}\n\nalso\n\n"
        "## Two\n\nold 2\n"
    )
    generated = "# B\n\nnew intro\n\n## One\n\nnew 1\n\n## Two\n\nnew 2\n\n## Three\n\nnew 3\n"
    assert keep_hand_written(generated, existing) == (
        "# B\n\nnew intro\n\n## One\n\nnew 1\n\n"
        f"## Mine\n\n{HAND_WRITTEN}\n\nmine\n\n"
        f"## Also mine\n\n{HAND_WRITTEN}\n\nalso\n\n"
        "## Two\n\nnew 2\n\n## Three\n\nnew 3\n"
    )


def test_a_hand_written_section_whose_neighbour_is_gone_follows_the_title() -> None:
    existing = f"# B\n\n## Gone\n\nx\n\n## Mine\n\n{HAND_WRITTEN}\n\nmine"
    generated = "# B\n\n## New\n\ny\n\n## Mine\n\ngenerated, replaced by the hand-written one\n"
    assert keep_hand_written(generated, existing) == (
        f"# B\n\n## Mine\n\n{HAND_WRITTEN}\n\nmine\n## New\n\ny\n\n"
    )


def test_write_markdown_keeps_the_page_s_hand_written_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "benchmarks.md"
    text = DOCS_PAGE.read_text()
    fresh = _without_hand_written(text).replace("## Targets", "## Targets\n\nnew figures")

    def generate(doc: dict[str, Any]) -> str:
        return fresh

    monkeypatch.setattr(_report, "markdown", generate)
    _report.write_markdown({}, page)  # no page yet: the generated one
    assert page.read_text() == fresh
    page.write_text(text)
    _report.write_markdown({}, page)
    written = page.read_text()
    assert "new figures" in written
    assert written == text.replace("## Targets", "## Targets\n\nnew figures")
