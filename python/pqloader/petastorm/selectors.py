"""Petastorm's row-group selectors, over the indexes ``build_rowgroup_index`` stored.

``select_row_groups(index_dict)`` returns the piece numbers (row groups, numbered in
sorted-file order) to read; pqloader then reads only those row groups
(``Loader(row_groups=...)``), without fetching the others.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


class RowGroupSelectorBase:
    """Base class of row-group selectors."""

    def get_index_names(self) -> list[str]:
        raise NotImplementedError

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        raise NotImplementedError


class SingleIndexSelector(RowGroupSelectorBase):
    """Row groups holding any of `values_list` in index `index_name`."""

    def __init__(self, index_name: str, values_list: Sequence[Any]) -> None:
        self._index_name = index_name
        self._values_to_select = values_list

    def get_index_names(self) -> list[str]:
        return [self._index_name]

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        indexer = index_dict[self._index_name]
        out: set[int] = set()
        for value in self._values_to_select:
            out |= indexer.get_row_group_indexes(value)
        return out


class IntersectIndexSelector(RowGroupSelectorBase):
    """Row groups every one of `single_index_selectors` selects."""

    def __init__(self, single_index_selectors: Sequence[RowGroupSelectorBase]) -> None:
        self._selectors = list(single_index_selectors)

    def get_index_names(self) -> list[str]:
        return [n for s in self._selectors for n in s.get_index_names()]

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        sets = [s.select_row_groups(index_dict) for s in self._selectors]
        return set.intersection(*sets) if sets else set()


class UnionIndexSelector(RowGroupSelectorBase):
    """Row groups any of `single_index_selectors` selects."""

    def __init__(self, single_index_selectors: Sequence[RowGroupSelectorBase]) -> None:
        self._selectors = list(single_index_selectors)

    def get_index_names(self) -> list[str]:
        return [n for s in self._selectors for n in s.get_index_names()]

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        out: set[int] = set()
        for s in self._selectors:
            out |= s.select_row_groups(index_dict)
        return out


__all__ = ["RowGroupSelectorBase", "SingleIndexSelector", "IntersectIndexSelector", "UnionIndexSelector"]
