"""The studio's services: what the GUI and the CLI both do, once (docs/ARCHITECTURE.md).

A service takes plain values and returns plain data (dicts, dataclasses); it never prints, never parses a
command line and never imports Qt. `hexstudio ...` (hexstudio.cli) parses and prints around it, the studio's
pages (hexstudio.ui) show what it returns. A failure a person can act on raises ServiceError (or another
ActionableError), which both faces show as message + what to do.
"""

from __future__ import annotations

from hexstudio.shared.errors import ActionableError


class ServiceError(ActionableError):
    """A request a service cannot fulfil, with what to do about it."""
