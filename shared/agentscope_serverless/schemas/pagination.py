"""A page of a longer listing, with an opaque cursor to the next one."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """Items of one page; ``next_cursor`` is None on the last page.

    Pass ``next_cursor`` back unchanged to get the following page; its content is private
    to the backend that made it.
    """

    items: list[T]
    next_cursor: str | None = None


__all__ = ["Page"]
