"""The single source of the package version (the wheel builder reads it)."""

__version__ = "0.1.0"
