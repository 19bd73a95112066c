"""What gpu_placement did to each stage, as frozen dataclasses (and the summary lines it prints).

    StagePlacement(stage="stage", main_device="/device:GPU:0", buffer_device_before="/device:CPU:0",
                   buffer_device_after="/device:GPU:0", device_changes=(DeviceChange("hash", "/device:GPU:0",
                   "/device:CPU:0", "prefetch side"), ...), boundary=(BoundaryCopy("hash:0", ...), ...))

One per stage in PassResult.details and ctx.gpu_placement; `as_dict()` gives plain JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from smartstage.passes.gpu.devices import is_gpu
from smartstage.passes.gpu.kernels import DEVICE, HOST


@dataclass(frozen=True)
class DeviceChange:
    node: str
    before: str
    after: str
    why: str


@dataclass(frozen=True)
class KeptNode:
    node: str
    device: str
    reason: str


@dataclass(frozen=True)
class BoundaryCopy:
    """One boundary tensor: how the buffer holds it and where its copy to the GPU happens."""

    tensor: str          # as the prefetch side names it ("hash:0")
    take_output: str     # what the main side reads ("stage/take:1")
    dtype: str
    memory: str          # "device" or "host" inside the buffer
    copy_to_gpu: str     # where the host-to-device copy happens now
    reason: str


@dataclass(frozen=True)
class StagePlacement:
    """What the pass did to one stage, as data."""

    stage: str
    main_device: str | None
    buffer_device_before: str
    buffer_device_after: str
    device_changes: tuple[DeviceChange, ...] = ()
    boundary: tuple[BoundaryCopy, ...] = ()
    copies: tuple[tuple[str, str], ...] = ()  # (shared node, its prefetch-side copy)
    kept: tuple[KeptNode, ...] = ()
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """Plain dicts and lists, for JSON."""
        return asdict(self)

    def summary_lines(self) -> list[str]:
        lines = []
        moved = [c for c in self.device_changes if c.why != "stage"]
        if moved:
            targets = sorted({c.after for c in moved})
            shown = ", ".join(f"{c.node} ({c.before or 'no device'} -> {c.after})" for c in moved[:6])
            more = f", ... (+{len(moved) - 6})" if len(moved) > 6 else ""
            lines.append(f"{self.stage}: {len(moved)} prefetch-side node(s) placed on {', '.join(targets)}: {shown}{more}")
        staged = [c for c in self.device_changes if c.why == "stage"]
        if staged:
            lines.append(f"{self.stage}: the buffer and its ops moved to {self.buffer_device_after}: "
                         + ", ".join(f"{c.node} ({c.before or 'no device'} -> {c.after})" for c in staged))
        on_gpu = [b for b in self.boundary if b.memory == DEVICE]
        on_host = [b for b in self.boundary if b.memory == HOST]
        if on_gpu:
            lines.append(f"{self.stage}: {len(on_gpu)} boundary tensor(s) reach {self.buffer_device_after} on the "
                         "prefetch side (copied at the put): " + ", ".join(f"{b.tensor} ({b.dtype})" for b in on_gpu))
        if on_host and (on_gpu or is_gpu(self.buffer_device_after)):
            lines.append(f"{self.stage}: {len(on_host)} stay in host memory (_input_hostmem on the put, "
                         "_output_hostmem on the take): "
                         + "; ".join(f"{b.tensor} ({b.dtype}): {b.reason}" for b in on_host[:6])
                         + (f"; ... (+{len(on_host) - 6})" if len(on_host) > 6 else ""))
        if self.copies:
            lines.append(f"{self.stage}: {len(self.copies)} node(s) the main side also uses were copied for the "
                         "prefetch side: " + ", ".join(f"{a} -> {b}" for a, b in self.copies[:6]))
        for k in self.kept[:6]:
            lines.append(f"{self.stage}: left {k.node} on {k.device or 'no device'}: {k.reason}")
        if len(self.kept) > 6:
            lines.append(f"{self.stage}: ... and {len(self.kept) - 6} more node(s) left")
        lines.extend(f"{self.stage}: {n}" for n in self.notes)
        return lines


__all__ = ["BoundaryCopy", "DeviceChange", "KeptNode", "StagePlacement"]
