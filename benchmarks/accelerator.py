"""The emulated accelerator of the benchmarks: the model's compute as a wait of T ms that uses no host CPU.

    model = with_device_step(build_dlrm(..., options=device_options("dlrm")), device_ms=5.0)
    loss = device_wait(loss, 5.0)     # TF2: inside the tf.function step

The code lives in smartstage/examples/device.py (the `smartstage demo --train` command uses it too); see
its docstring for what is emulated and what is not.
"""

from smartstage.examples.device import device_options, device_wait, with_device_step

__all__ = ["device_options", "device_wait", "with_device_step"]
