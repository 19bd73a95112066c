"""One tf.function step split in two: the work that reads no trained state runs in the dataset's map, the rest
is the step the loop calls (ss.tf2.split). Every module here serves that one split; nothing here knows Keras.

    before:  for batch in raw: train_step(batch)
    after:   s = split(train_step, raw);  for batch in s.dataset: s.step(batch)
"""
