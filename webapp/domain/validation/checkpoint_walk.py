"""Every tensor in a loaded torch file, with its place (tensor_places): the child side of
the rule in docs/validation.md, "Where a value lives". Imports torch, never Django."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from webapp.domain.validation.tensor_places import is_optimizer_state_dict, path_name, role_of


@dataclass(frozen=True)
class Found:
    """One tensor: `name` is `<file>:<path>` (the name findings and keys use)."""

    name: str
    role: str
    tensor: torch.Tensor


def walk(obj, file: str) -> Iterator[Found]:
    """Every tensor in nested dicts/lists/tuples, in insertion order, and every numeric
    numpy array (as a tensor viewing the same memory, so that it is scanned too); other
    values are skipped. Iterative, and safe against containers that hold themselves (a
    pickle can build those)."""
    stack: list[tuple[tuple, bool, object]] = [((), False, obj)]
    seen: set[int] = set()
    while stack:
        path, in_optimizer, value = stack.pop()
        tensor = _as_tensor(value)
        if tensor is not None:
            role = role_of(file, path, tensor.numel(), in_optimizer_state=in_optimizer)
            yield Found(f"{file}:{path_name(path)}", role, tensor)
            continue
        items: list[tuple[str | int, object]]
        if isinstance(value, dict):
            items = [(k if isinstance(k, str) else str(k), v) for k, v in value.items()]
        elif isinstance(value, list | tuple):
            items = list(enumerate(value))
        else:
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        optimizer_here = is_optimizer_state_dict(value)
        for key, child in reversed(items):
            below = in_optimizer or (optimizer_here and key == "state")
            stack.append(((*path, key), below, child))


def _as_tensor(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    numpy = sys.modules.get("numpy")  # arrays exist only if the load imported numpy
    if numpy is not None and type(value) is numpy.ndarray and value.dtype.kind in "fc":
        try:
            return torch.from_numpy(value)
        except (TypeError, ValueError):  # a dtype torch has no match for (float128)
            return None
    return None
