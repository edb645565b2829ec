"""The PySide6 studio window."""
