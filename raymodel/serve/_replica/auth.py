"""API keys of a route (``ServeSettings(api_keys=...)``): every request carries ``Authorization: Bearer
<key>``. The keys are kept only as their sha256 digests from the moment the settings are made, so no
setting, log line, replica argument or ``/info`` answer ever holds one."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping

PREFIX = "sha256:"


def digest(key: str) -> str:
    return PREFIX + hashlib.sha256(key.encode()).hexdigest()


def digests(value: Any) -> tuple[tuple[str, ...] | None, str | None]:
    """``(the keys' digests, None)`` or ``(None, what is wrong)``. ``value``: a list of keys (a key given
    as ``"sha256:<hex>"`` is taken as its digest already), or a string naming an environment variable
    (keys separated by commas or white space) or a file (one key per line)."""
    if value is None:
        return None, None
    if isinstance(value, str):
        if value in os.environ:
            keys = os.environ[value].replace(",", " ").split()
            where = f"the environment variable `{value}`"
        elif os.path.isfile(value):
            with open(value, encoding="utf-8") as fh:
                keys = [line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#")]
            where = f"the file `{value}`"
        else:
            return None, (
                f"`api_keys` is a string, so it names an environment variable or a file holding the keys; "
                f"`{value[:40]}` is neither (set the variable, or pass the keys as a list)."
            )
        if not keys:
            return None, f"`api_keys`: {where} holds no key."
    elif isinstance(value, (list, tuple)) and value and all(isinstance(k, str) and k.strip() for k in value):
        keys = [k.strip() for k in value]
    else:
        return None, (
            "`api_keys` takes a non-empty list of keys (strings), or the name of an environment variable or "
            f"file holding them (got a {type(value).__name__})."
        )
    return tuple(k if _is_digest(k) else digest(k) for k in keys), None


def _is_digest(key: str) -> bool:
    return key.startswith(PREFIX) and len(key) == len(PREFIX) + 64


def allowed(keys: tuple[str, ...] | None, headers: Mapping[str, str]) -> bool:
    """Whether a request with ``headers`` may use a route guarded by ``keys`` (None: open)."""
    if not keys:
        return True
    scheme, _, key = (headers.get("authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and bool(key.strip()) and digest(key.strip()) in keys


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="raymodel"'}
MISSING = (
    "This route needs an API key: send `Authorization: Bearer <key>` (the OpenAI client's `api_key`). "
    "The key was missing or is not one of the route's."
)
