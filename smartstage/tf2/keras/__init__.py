"""ss.tf2.fit for Keras models: the route a model takes (its own step split at op level, or a Keras 3 functional
model cut at layer level), the trial, and the model's own fit on the mapped dataset.

    before:  model.fit(ds, epochs=3)
    after:   ss.tf2.fit(model, ds, epochs=3)
"""
