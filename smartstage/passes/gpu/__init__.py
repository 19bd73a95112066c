"""The GPU passes (placement, multi-stream) and the device placement facts they share.

    devices          cpu_device_for("/job:w/replica:0/task:1/device:GPU:0", task)  # ".../task:1/device:CPU:0"
    kernels          kernel_for(node, "GPU"); input_memory(node, 1, "GPU")  # the KernelDef; "host" or "device"
    colocation       ColocationGroups(view).group("q")  # ("put", "q", "take", ...): nodes the placer keeps together
    prefetch_sides   prefetch_sides(view, stages)  # per stage, the nodes its put needs; which the main side uses too

Import the names from their module (`from smartstage.passes.gpu.kernels import input_memory`).
"""
