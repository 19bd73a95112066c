"""attributes: instance attributes set on a user's object for the duration of one call, then put back.

    before:  model.train_step                       # the class's method
    after:   with overridden(model, train_step=main_side): model.fit(...)    # afterwards: the method again

An attribute the object had in its own __dict__ is restored to that value; one it did not have is removed, so
the class's attribute shows through again. Set with object.__setattr__: Keras's tracking __setattr__ would
record a function as a layer attribute.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

_MISSING = object()


@contextlib.contextmanager
def overridden(obj: Any, **attributes: Any) -> Iterator[None]:
    """`obj`'s instance attributes set to `attributes` for the duration (also on error)."""
    saved = {name: obj.__dict__.get(name, _MISSING) for name in attributes}
    try:
        for name, value in attributes.items():
            object.__setattr__(obj, name, value)
        yield
    finally:
        for name, value in saved.items():
            if value is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                object.__setattr__(obj, name, value)


__all__ = ["overridden"]
