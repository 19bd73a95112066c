"""The emulated accelerator of the benchmarks: the model's compute as a wait of T ms that uses no host CPU.

    model = build_device_model(data, vocab, model="dlrm", device_ms=5.0, stage_fn=ss.staged)  # TF1 graph
    loss = device_wait(loss, 5.0)     # TF2: inside the tf.function step (the wait on a value of the loss)

The code lives in smartstage/examples/device.py (the `smartstage demo --train` command uses it too); see
its docstring for what is emulated and what is not.
"""

from smartstage.examples.device import build_device_model, device_options, device_wait, with_device_step

__all__ = ["build_device_model", "device_options", "device_wait", "with_device_step"]
