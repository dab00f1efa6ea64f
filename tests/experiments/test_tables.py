"""Results as Markdown tables."""

from __future__ import annotations

from transformer_xl.experiments.tables import markdown_table


def test_markdown_table() -> None:
    assert markdown_table(["a", "b"], [[1, None]]) == "| a | b |\n|---|---|\n| 1 |  |\n"
