"""The package version, in a module that imports nothing (so nothing circles through ``__init__``)."""

__version__ = "0.1.0"
