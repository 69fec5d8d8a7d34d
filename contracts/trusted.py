"""`model_construct` for the hot paths, at a third of its cost.

pydantic's `BaseModel.model_construct` walks every field of the model on each call
(aliases, validation aliases, defaults) before it sets the instance's attributes; the
one-shot answer builds two models per result (`TopKResult`, `ScoreBreakdown`), ~10 µs
of the ~14 µs each result cost to assemble (session 19). `trusted_constructor(model)`
checks once that the model has nothing that walk is for, and returns a function that
sets the same four attributes directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["trusted_constructor"]

M = TypeVar("M", bound=BaseModel)

_setattr = object.__setattr__


def trusted_constructor(model: type[M]) -> Callable[..., M]:
    """A function equal to `model.model_construct(**values)` (no validation): the same
    `__dict__` (field order too, when the values are given in declaration order), the
    same `model_fields_set`, the same serialization. A call that does not give every
    field by name is `model_construct`'s own (it fills in the defaults).

    `ValueError` for a model whose construction does more than set its fields: one with
    aliases, private attributes, a `model_post_init`, `extra="allow"` or a root model."""
    fields = model.__pydantic_fields__
    if (
        any(f.alias is not None or f.validation_alias is not None for f in fields.values())
        or model.__private_attributes__
        or model.__pydantic_post_init__
        or model.model_config.get("extra") == "allow"
        or model.__pydantic_root_model__
    ):
        raise ValueError(f"{model.__name__} needs pydantic's model_construct")
    names = frozenset(fields)
    new = model.__new__
    fallback = model.model_construct

    def construct(**values: Any) -> M:
        if values.keys() != names:
            return fallback(**values)
        instance = new(model)
        _setattr(instance, "__dict__", values)
        _setattr(instance, "__pydantic_fields_set__", set(values))
        _setattr(instance, "__pydantic_extra__", None)
        _setattr(instance, "__pydantic_private__", None)
        return instance

    return construct
