"""Exceptions a user can act on. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class TXLError(Exception):
    """Base class of every error caused by user input (files, configs, arguments)."""


class ConfigError(TXLError, ValueError):
    """An impossible or unknown configuration value."""


class CheckpointError(TXLError):
    """A missing, corrupt or incompatible weights/checkpoint file."""


class DataError(TXLError):
    """A missing, corrupt or malformed dataset file, or a bad data argument."""
