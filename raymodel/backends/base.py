"""Moved: the backend contract is ``raymodel.contract`` (``from raymodel.contract import Backend,
WorkerLoop``). This module keeps plug-ins written against the old path working, with a warning."""

import warnings

from raymodel.contract import (  # noqa: F401 - re-exported for the old import path
    DATA_KINDS,
    Backend,
    WorkerLoop,
    batch_len,
    columns_of,
    features_of,
    rows_of,
    to_jsonable,
)

warnings.warn(
    "`raymodel.backends.base` moved to `raymodel.contract`: import `Backend` and `WorkerLoop` from there.",
    DeprecationWarning,
    stacklevel=2,
)
