"""settings.json's edits across processes (the studio and a terminal at once)."""

from __future__ import annotations

from pathlib import Path


def test_two_edits_at_once_keep_both(tmp_path: Path) -> None:
    """Settings.edit was read-change-write without a lock: the studio adding a board while `hexstudio board add`
    added another kept only one of them. Edits now take turns (a flock on settings.json.lock)."""
    import threading
    import time

    from hexstudio.core.settings import Settings

    path = tmp_path / "settings.json"
    Settings(path).save()

    def add(name: str) -> None:
        def change(s: Settings) -> None:
            time.sleep(0.02)  # between the read and the write, where another edit once came in
            s.boards[name] = {"host": f"{name}.lan", "auth": "agent"}

        Settings.edit(change, path)

    threads = [threading.Thread(target=add, args=(f"b{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(Settings.load(path).boards) == sorted(f"b{i}" for i in range(8))
