"""Option names that changed: the old spelling still works for one release and warns once per call.

    before:  ss.enable_smart_stage(config, gpu=True)                  # FutureWarning naming do_smart_stage_gpu
    after:   ss.enable_smart_stage(config, do_smart_stage_gpu=True)   # DeepRec's field name, no warning

FutureWarning, not DeprecationWarning: Python shows FutureWarning to whoever runs the script, wherever the
call is, so a training job's owner sees the rename before the old name goes. DeepRec's names
(`do_smart_stage`, `do_smart_stage_gpu`, `stage_multi_stream`, `tf.SmartStageOptions` fields) are the
current spellings, never renamed here: a DeepRec script ports by changing one import.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Mapping

from smartstage.errors import ConfigError

# SmartStageOptions fields (and so optimize()'s and options_from_config()'s overrides, and the
# custom_optimizers keys): old name -> new name. A count of prefetch threads is num_threads everywhere
# (staged()'s and DeepRec's name).
OPTION_RENAMES = {"tfdata_service": "tf_data_service", "input_lanes_per_task": "input_num_threads_per_task"}
# enable_smart_stage()'s keywords: its own short names become the option names they set
ENABLE_RENAMES = {"gpu": "do_smart_stage_gpu", "multi_stream": "stage_multi_stream",
                  "tfdata_service": "tf_data_service"}
# smartstage.tf2.split()'s keywords (num_parallel_calls: the dataset map's threads)
SPLIT_RENAMES = {"tfdata_service": "tf_data_service", "num_parallel_calls": "num_threads"}
# old input_mode value -> new one
INPUT_MODE_RENAMES = {"tfdata_service": "tf_data_service"}


def warn_renamed(where: str, old: str, new: str, stacklevel: int = 2) -> None:
    """One FutureWarning: `where`'s `old` is now spelled `new`, same meaning. stacklevel counts from the
    function that calls this one, as warnings.warn's does (2: that function's caller, the user's line)."""
    warnings.warn(f"{where}: {old} is deprecated and will be removed in the next release; use {new} "
                  "(same meaning)", FutureWarning, stacklevel=stacklevel + 1)


def renamed_keywords(where: str, keywords: Mapping[str, Any], renames: Mapping[str, str] = OPTION_RENAMES,
                     stacklevel: int = 2) -> dict[str, Any]:
    """`keywords` with each old name of `renames` replaced by its new name, one FutureWarning per old name.

        before:  renamed_keywords("enable_smart_stage()", {"gpu": True})
        after:   {"do_smart_stage_gpu": True}     # FutureWarning: gpu= ... use do_smart_stage_gpu=

    Both spellings of one option given is a ConfigError naming them.
    """
    result = dict(keywords)
    for old, new in renames.items():
        if old not in result:
            continue
        if new in result:
            raise ConfigError(f"{where}: {old}= and {new}= are one option given twice; pass {new}= only")
        warn_renamed(where, f"{old}=", f"{new}=", stacklevel=stacklevel + 1)
        result[new] = result.pop(old)
    return result


def renamed_arguments(where: str, renamed: Mapping[str, Any], given: Mapping[str, Any], defaults: Mapping[str, Any],
                      renames: Mapping[str, str], hint: str = "", stacklevel: int = 2) -> dict[str, Any]:
    """`given` (a function's keywords under their current names) with the values of their old spellings in
    `renamed` (the function's **renamed), one FutureWarning per old name.

        before:  renamed_arguments("split()", {"num_parallel_calls": 2}, {"num_threads": -1}, {"num_threads": -1},
                                   SPLIT_RENAMES)
        after:   {"num_threads": 2}     # FutureWarning: num_parallel_calls= ... use num_threads=

    A keyword of `renamed` that is no old name is a ConfigError naming it (and `hint`: where to look); so is
    an old name whose new one was given too (not its default).
    """
    unknown = sorted(set(renamed) - set(renames))
    if unknown:
        raise ConfigError(f"{where} takes no argument {unknown[0]!r}" + (f"; {hint}" if hint else ""))
    targets = {renames[old] for old in renamed}
    both = {new: value for new, value in given.items() if new in targets and value != defaults[new]}
    return {**given, **renamed_keywords(where, {**renamed, **both}, renames, stacklevel=stacklevel + 1)}


def renamed_fields(renames: Mapping[str, str]) -> Callable[[type], type]:
    """A decorator for a dataclass some of whose fields were renamed: its constructor takes each old keyword of
    `renames` too, and each old name reads as an attribute, each use with one FutureWarning.

        before:  PipelineReport(..., lanes=2).lanes                  # two FutureWarnings, the value 2
        after:   PipelineReport(..., num_threads=2).num_threads

    Both spellings given to the constructor is a ConfigError (renamed_keywords).
    """
    def decorate(cls: type) -> type:
        generated = cls.__init__

        @functools.wraps(generated)  # the signature, docstring and annotations' module stay the dataclass's
        def __init__(self, *args, **keywords) -> None:
            generated(self, *args, **renamed_keywords(f"{cls.__name__}()", keywords, renames))

        cls.__init__ = __init__
        for old, new in renames.items():
            setattr(cls, old, _renamed_attribute(cls.__name__, old, new))
        return cls

    return decorate


def _renamed_attribute(where: str, old: str, new: str) -> property:
    def read(self):
        warn_renamed(where, old, new, stacklevel=2)
        return getattr(self, new)

    return property(read, doc=f"Deprecated spelling of {new} (FutureWarning).")


def renamed_input_mode(where: str, mode: str, stacklevel: int = 2) -> str:
    """The current spelling of an input_mode value, warning once when `mode` is an old one."""
    new = INPUT_MODE_RENAMES.get(mode)
    if new is None:
        return mode
    warn_renamed(where, f"input_mode={mode!r}", f"input_mode={new!r}", stacklevel=stacklevel + 1)
    return new
