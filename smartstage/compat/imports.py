"""DeepRec-only modules that model-zoo scripts import from `tensorflow` directly, under a flag.

    from tensorflow.python.ops.work_queue import WorkQueue                           # --workqueue True
    from tensorflow.python.data.experimental.ops import parquet_dataset_ops          # --parquet_dataset True

On stock TensorFlow these imports fail with ModuleNotFoundError, far from the flag that caused them.
`install()` adds a finder that answers only for these module names, and only when TensorFlow has no
such module: the import succeeds and the first use of the class raises DeepRecFeatureError naming the
flag that turns it off. Every other import is untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

from .deeprec_only import PARQUET_DATASET, WORK_QUEUE, raiser

_MODULES = {
    "tensorflow.python.ops.work_queue": {"WorkQueue": raiser(WORK_QUEUE)},
    "tensorflow.python.data.experimental.ops.parquet_dataset_ops": {"ParquetDataset": raiser(PARQUET_DATASET)},
}


class _DeepRecOnlyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULES:
            return None
        # Appended last to sys.meta_path: reached only when no finder before it has the module.
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__.update(_MODULES[module.__name__])


def install() -> None:
    """Adds the finder once (at the end of sys.meta_path, so any real module wins)."""
    if not any(isinstance(f, _DeepRecOnlyModules) for f in sys.meta_path):
        sys.meta_path.append(_DeepRecOnlyModules())
