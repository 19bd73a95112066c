"""tf.errors codes from exception classes or codes, as staged() and the options take them.

    error_codes((tf.errors.OutOfRangeError, tf.errors.DATA_LOSS), "staged(closed_exception_types=...)")  # [11, 15]

TensorFlow's errors module is imported on the first call, so importing this module stays cheap.
"""

from __future__ import annotations

import functools
from typing import Iterable

from smartstage.errors import ConfigError

OUT_OF_RANGE = 11  # tf.errors.OUT_OF_RANGE, without importing TensorFlow's Python API


@functools.cache
def _code_of_class() -> dict[type, int]:
    from tensorflow.python.framework import errors_impl

    return {cls: code for code, cls in errors_impl._CODE_TO_EXCEPTION_CLASS.items()}  # noqa: SLF001


def error_codes(exception_types: Iterable | type | int | None, what: str) -> list[int]:
    """TensorFlow error codes for exception classes (tf.errors.OutOfRangeError) or codes (11).

        before:  (tf.errors.OutOfRangeError, tf.errors.DATA_LOSS)
        after:   [11, 15]
    """
    if exception_types is None:
        return []
    if isinstance(exception_types, (type, int)):
        exception_types = (exception_types,)
    codes = []
    for item in exception_types:
        if isinstance(item, bool):
            code = None
        elif isinstance(item, int):
            code = item if item in _code_of_class().values() else None
        else:
            code = _code_of_class().get(item)
        if code is None:
            raise ConfigError(
                f"{what}: {item!r} is neither a tf.errors exception class (like tf.errors.OutOfRangeError) "
                "nor a tf.errors code (like tf.errors.OUT_OF_RANGE); pass one of those"
            )
        if code not in codes:
            codes.append(code)
    return codes

