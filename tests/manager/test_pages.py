"""Long answers come in pages that each fit well inside one D-Bus message."""

from typing import Any

import pytest

from boxd.dbus.client import whole
from boxd.errors import BoxError
from boxd.manager.pages import PAGE_CHARS, one_page, with_next
from boxd.reading.strict_json import size

Row = tuple[int, dict[str, Any] | None]


def rows(count: int, chars: int) -> list[Row]:
    return [(n, {"n": n, "blob": "x" * chars}) for n in range(1, count + 1)]


def fetcher(all_rows: list[Row]) -> Any:
    async def fetch(after: int | None, limit: int) -> list[Row]:
        return [row for row in all_rows if row[0] > (after or 0)][:limit]

    return fetch


async def every_page(all_rows: list[Row]) -> list[list[dict[str, Any]]]:
    found, page = [], ""
    while True:
        items, following = await one_page(fetcher(all_rows), page)
        found.append(items)
        if following is None:
            return found
        page = following


async def test_pages_split_by_size_and_lose_nothing() -> None:
    many = rows(100, 200_000)
    found = await every_page(many)
    assert len(found) > 4
    assert [item["n"] for page in found for item in page] == list(range(1, 101))
    for page in found:
        assert sum(size(item) for item in page) <= PAGE_CHARS


async def test_one_item_bigger_than_a_page_still_comes() -> None:
    found = await every_page(rows(3, PAGE_CHARS + 10))
    assert [[item["n"] for item in page] for page in found] == [[1], [2], [3]]


async def test_small_answers_are_one_page_and_unreadable_rows_are_skipped() -> None:
    few: list[Row] = [*rows(3, 10), (4, None), *[(5, {"n": 5})]]
    assert [[item["n"] for item in page] for page in await every_page(few)] == [[1, 2, 3, 5]]
    many: list[Row] = [(n, None if n % 2 else {"n": n}) for n in range(1, 1001)]
    assert [item["n"] for page in await every_page(many) for item in page] == list(
        range(2, 1001, 2)
    )


@pytest.mark.parametrize("page", ["-1", "\u00b2", "\u0663", "9" * 20, "1" * 5000])
async def test_a_cursor_not_handed_out_is_refused(page: str) -> None:
    with pytest.raises(BoxError, match="is not one this box handed out"):
        await one_page(fetcher([]), page)


async def test_clients_put_the_pages_together() -> None:
    answers = {
        "": with_next({"id": "t1", "steps": [1, 2]}, "2"),
        "2": with_next({"id": "t1", "steps": [3]}, "3"),
        "3": {"id": "t1", "steps": []},
    }

    async def ask(page: str) -> Any:
        return answers[page]

    assert await whole(ask, "steps") == {"id": "t1", "steps": [1, 2, 3]}
