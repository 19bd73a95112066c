"""Where a Keras model's variables live, and what that decides for its split: one device (the step is one
tf.function) or a tf.distribute strategy's replicas (the step split per replica, on each replica's slice).

    before:  with strategy.scope(): model = build();  model.fit(ds)
    after:   placement_of(model).split_step(model, "train_step", ds, ...)
"""
