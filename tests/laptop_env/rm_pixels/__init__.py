"""A package of the laptop's own that the model's module imports, named in ``rm.init(runtime_env=
{"py_modules": [...]})``: it does not travel with the class (it is not the class's package), so the
cluster's processes import it from Ray's package store, or not at all."""

MARK = 3.0


def centred(x):
    return x - 0.5
