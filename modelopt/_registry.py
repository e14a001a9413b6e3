"""A tiny name -> object registry shared by every plugin kind (timm's register/create/list)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from importlib import metadata
from typing import Any, Generic, TypeVar

from modelopt.errors import UnknownNameError

T = TypeVar("T")


def named(kind: str) -> Callable[[str, type[Any]], None]:
    """An `on_register` that gives a plugin class the name it registers under (its ``name``), so the name is
    written once, in the decorator (timm's `register_model` takes it from the function); a class that spells
    another name itself is refused, naming both.

    Example:
        >>> ENGINES = Registry("latency engine", None, named("latency engine"))
        >>> @ENGINES.register("toy")
        ... class Toy: ...
        >>> Toy.name
        'toy'
    """

    def set_name(name: str, cls: type[Any]) -> None:
        own = vars(cls).get("name")
        if own is not None and own != name:
            raise ValueError(f"{kind} class {cls.__name__} says name = {own!r} but is registered as {name!r}; "
                             "drop its name: registering names it")
        cls.name = name

    return set_name


class Registry(Generic[T]):
    """Maps names to plugins; third parties add more through an entry-point group.

    Example:
        >>> STRATEGIES = Registry("strategy", "modelopt.strategies")
        >>> @STRATEGIES.register("random")
        ... class RandomSearch: ...
        >>> STRATEGIES.get("random") is RandomSearch
        True
    """

    def __init__(self, kind: str, entry_point_group: str | None = None,
                 on_register: Callable[[str, T], None] | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.on_register = on_register  # e.g. gives a plugin its registered name: the name is written once
        self._items: dict[str, T] = {}
        self._entry_points_loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if self.on_register is not None:
                self.on_register(name, obj)
            self._items[name] = obj
            return obj

        return deco

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded or self.entry_point_group is None:
            return
        self._entry_points_loaded = True
        for ep in metadata.entry_points(group=self.entry_point_group):
            if ep.name not in self._items:
                self.register(ep.name)(ep.load())

    def get(self, name: str) -> T:
        self._load_entry_points()
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._items) from None

    def names(self, pattern: str = "*") -> list[str]:
        self._load_entry_points()
        return sorted(n for n in self._items if fnmatch.fnmatch(n, pattern))

    def __contains__(self, name: object) -> bool:
        self._load_entry_points()
        return name in self._items
