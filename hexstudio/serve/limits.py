"""What one client of `hexstudio serve` may hold or send (light: the CLI reads the defaults for its --help)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one client may hold or send. Defaults fit a studio on a workstation; `hexstudio serve` flags set them."""

    max_body: int = 8 << 20  # bytes of a request body (413 above)
    max_header: int = 32 << 10  # bytes of the request line + headers (400 above, h11)
    header_timeout: float = 10.0  # seconds to send the request line + headers (408, connection closed)
    body_timeout: float = 30.0  # seconds to send the body once the headers are in (408)
    keep_alive: float = 5.0  # seconds an idle keep-alive connection is kept
    max_connections: int = 4096  # open connections (503 + close above: file descriptors stay free)
    max_queue: int = 16  # requests waiting for the dialog (429 + Retry-After above)
    shutdown_grace: float = 10.0  # seconds a running generation gets to finish when the server stops
