"""What both benchmarks share: the machine they ran on, statistics of noisy samples, tables, files.

    machine = machine_info()                         # cores, CPU model, load average, versions
    spread = Spread.of([31.2, 29.8, 33.0])           # median, min, max
    print(markdown_table(["config", "steps/s"], rows))
    paths = write_outputs(out_dir, "e2e", result_dict, figure)   # JSON (+ PNG), timestamped and *-latest
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "out"
PUBLISH_DIR = REPO_ROOT / "docs" / "perf"


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements (the machine is shared: report both)."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> "Spread":
        values = [v for v in values if v is not None]
        if not values:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def text(self, digits: int = 1) -> str:
        if self.n == 0:
            return "-"
        if self.n == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> Optional[float]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_average() -> Optional[tuple[float, float, float]]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


_SPIN = "import time\nend = time.perf_counter() + {seconds}\nwhile time.perf_counter() < end: pass\n"


def available_cores(seconds: float = 0.4) -> float:
    """Cores this process could get right now: CPU seconds that one busy process per core obtained
    over `seconds` of wall time. On a shared machine it is below os.cpu_count()."""
    import resource
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-S", "-c", _SPIN.format(seconds=seconds)])
             for _ in range(os.cpu_count() or 1)]
    for proc in procs:
        proc.wait()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / wall


def machine_info() -> dict[str, Any]:
    """Where a result was measured: enough to judge whether two results are comparable."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "load_average_at_start": load_average(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
    except ImportError:  # pragma: no cover
        pass
    return info


def machine_line(machine: dict[str, Any]) -> str:
    load = machine.get("load_average_at_start")
    load_text = f", load average {load[0]:.1f} at start" if load else ""
    return (f"{machine.get('cores')} cores ({machine.get('cpu')}), {machine.get('memory_gib')} GiB, "
            f"TensorFlow {machine.get('tensorflow')}, Python {machine.get('python')}{load_text}")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def to_jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return to_jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


def write_outputs(out_dir: Path, stem: str, result: dict[str, Any], figure=None, publish: bool = False,
                  text: Optional[str] = None) -> list[Path]:
    """Writes `<stem>-<time>.json` (+ .png, + .md: the printed report `text`) and copies them to
    `<stem>-latest.*`; with `publish`, also to docs/perf/<stem>.json, .png and .md (the files the docs
    reference)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    paths = []
    json_path = out_dir / f"{stem}-{stamp}.json"
    json_path.write_text(json.dumps(to_jsonable(result), indent=1, sort_keys=False) + "\n")
    paths.append(json_path)
    png_path = None
    if figure is not None:
        png_path = out_dir / f"{stem}-{stamp}.png"
        figure.savefig(png_path, dpi=110, bbox_inches="tight")
        paths.append(png_path)
    if text is not None:
        md_path = out_dir / f"{stem}-{stamp}.md"
        md_path.write_text(text)
        paths.append(md_path)
    for path in list(paths):
        latest = out_dir / f"{stem}-latest{path.suffix}"
        shutil.copyfile(path, latest)
        paths.append(latest)
        if publish:
            PUBLISH_DIR.mkdir(parents=True, exist_ok=True)
            published = PUBLISH_DIR / f"{stem}{path.suffix}"
            shutil.copyfile(path, published)
            paths.append(published)
    return paths


def pyplot():
    """matplotlib.pyplot with a file-only backend, or None when matplotlib is not installed
    (it is in the [report] extra: pip install -e ".[report]")."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
