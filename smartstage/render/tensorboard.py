def write_tensorboard(*a, **k):
    raise NotImplementedError
