"""Internals shared by the drivers and the backends. Not a public API."""
