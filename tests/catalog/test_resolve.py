"""Which catalog is in force, and a word when a checkout's edits would go unseen."""

from __future__ import annotations

from pathlib import Path

from peak_tune.catalog.resolve import unused_checkout


def _checkout(folder: Path) -> Path:
    (folder / "transforms").mkdir(parents=True)
    (folder / "seeds").mkdir()
    return folder


def test_a_checkout_edited_beside_the_catalog_in_use_is_named(tmp_path: Path) -> None:
    installed, here = _checkout(tmp_path / "site" / "_catalog"), _checkout(tmp_path / "repo")
    for root in (installed, here):
        (root / "transforms" / "unroll-k.md").write_text("Unroll the K loop.\n")
    assert unused_checkout(installed, here, []) is None  # the same files: no word
    (here / "transforms" / "unroll-k.md").write_text("Unroll the K loop by UNROLL_K.\n")
    warning = unused_checkout(installed, here, [])
    assert warning is not None and str(installed) in warning and "--catalog ." in warning


def test_no_word_where_the_checkout_is_in_use_or_there_is_none(tmp_path: Path) -> None:
    here = _checkout(tmp_path / "repo")
    assert unused_checkout(here, here, []) is None  # an editable install, or the checkout
    assert unused_checkout(tmp_path / "site", here, [here]) is None  # --catalog .
    assert unused_checkout(tmp_path / "site", tmp_path, []) is None  # not a checkout
