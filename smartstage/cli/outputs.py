"""The files one command writes, committed together or not at all.

    before:  smartstage optimize IN -o OUT --html DIR/    # the report fails (DIR is a folder): OUT is written
    after:   every output is first written to a temporary file beside its destination; only when all are
             written, and no destination is a folder, are they renamed into place. A failure leaves no
             output behind, and what was there before stays as it was.

A rename in the same folder is atomic; should one of the renames fail after others were done (a folder
replaced by another process meanwhile), the renamed ones are put back as they were.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from smartstage.graph.load import new_file_mode, temp_file_beside, user_path_error


class CommandOutputs:
    """Outputs of one command: `add()` files, `add_tree()` folders filled by a writer, then `commit()`.

        outputs = CommandOutputs()
        outputs.add("out.meta", graph_bytes); outputs.add("report.html", html)
        outputs.commit()          # both, or (on any error) neither
    """

    def __init__(self) -> None:
        self._files: list[tuple[str, Path]] = []  # (temporary file, destination)
        self._trees: list[tuple[str, Path]] = []  # (temporary folder, destination folder)

    def __enter__(self) -> "CommandOutputs":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.discard()  # after commit() there is nothing left to discard
        return False

    @property
    def paths(self) -> list[str]:
        return [str(p) for _, p in self._files] + [str(p) for _, p in self._trees]

    def add(self, path, payload: bytes | str) -> None:
        """Writes `payload` beside `path` now (OSError names `path`); `commit()` puts it in place."""
        path = Path(path)
        if path.is_dir():
            raise IsADirectoryError(21, "is a folder; name a file", str(path))
        data = payload.encode("utf-8") if isinstance(payload, str) else payload
        self._files.append((temp_file_beside(path, data), path))

    def add_tree(self, folder, fill: Callable[[str], object]) -> None:
        """Calls `fill(temporary folder)` now; `commit()` moves each file it wrote into `folder`."""
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(20, "is a file; name a folder", str(folder))
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix="." + folder.name + ".", dir=str(folder.parent))
        except OSError as e:
            raise user_path_error(e, folder) from None
        self._trees.append((tmp, folder))
        fill(tmp)

    def commit(self) -> None:
        """Renames every output into place; on failure puts back what was there and raises."""
        done: list[tuple[Path, str | None]] = []  # (destination, backup of what it replaced)
        try:
            for tmp, path in self._files:
                backup = None
                if path.exists():
                    fd, backup = tempfile.mkstemp(prefix="." + path.name + ".old.", dir=str(path.parent))
                    os.close(fd)
                    os.replace(path, backup)  # kept until every output is in place: a failure restores it
                try:
                    os.replace(tmp, path)
                except OSError as e:
                    if backup is not None:
                        os.replace(backup, path)
                    raise user_path_error(e, path) from None
                done.append((path, backup))
            for tmp, folder in self._trees:
                mode = new_file_mode()
                for root, _, names in os.walk(tmp):
                    for name in names:
                        source = Path(root) / name
                        destination = folder / source.relative_to(tmp)
                        destination.parent.mkdir(parents=True, exist_ok=True)
                        os.chmod(source, mode)
                        os.replace(source, destination)  # event files have unique names: nothing is replaced
                        done.append((destination, None))
        except BaseException:
            for path, backup in reversed(done):
                if backup is not None:
                    os.replace(backup, path)
                else:
                    path.unlink(missing_ok=True)
            raise
        for _, backup in done:
            if backup is not None:
                os.unlink(backup)
        self._files, trees = [], self._trees
        self._trees = []
        for tmp, _ in trees:
            shutil.rmtree(tmp, ignore_errors=True)

    def discard(self) -> None:
        """Removes every temporary file and folder not committed."""
        for tmp, _ in self._files:
            if os.path.exists(tmp):
                os.unlink(tmp)
        for tmp, _ in self._trees:
            shutil.rmtree(tmp, ignore_errors=True)
        self._files, self._trees = [], []
