"""A module-like namespace: its own names first, then lazily loaded names, then a TensorFlow module.

    train = Namespace("smartstage.compat.tf.train", tf.compat.v1.train, {"MonitoredSession": MonitoredSession})
    train.MonitoredSession        # ours
    train.Saver                   # tf.compat.v1.train.Saver
"""

from __future__ import annotations

import types
from typing import Any, Callable, Mapping


class Namespace(types.ModuleType):
    """A module that answers with its own names, then `lazy` loaders (called once), then `base`."""

    def __init__(self, name: str, base: types.ModuleType, own: Mapping[str, Any],
                 lazy: Mapping[str, Callable[[], Any]] | None = None):
        super().__init__(name, base.__doc__)
        self.__dict__.update(own)
        self._base = base
        self._lazy = dict(lazy or {})

    def __getattr__(self, name: str) -> Any:
        loader = self.__dict__.get("_lazy", {}).get(name)
        if loader is not None:
            value = loader()
            setattr(self, name, value)  # later lookups find it in __dict__
            return value
        return getattr(self._base, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._base)) | set(self.__dict__) | set(self._lazy))
