"""``ember dev --watch``'s watcher: the files a push bundles, a burst of saves reported once, caches ignored."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ember.dev.watch import changed, changes, snapshot


def _touch(path: Path, text: str, bump_ns: int = 0) -> None:
    path.write_text(text)
    if bump_ns:  # coarse file-system clocks: make the change visible whatever the time resolution
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump_ns))


def test_snapshot_holds_what_a_push_bundles(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text("x = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / ".ember").mkdir()
    (tmp_path / ".ember" / "state").write_text("platform state")
    (tmp_path / ".gitignore").write_text("weights/\n")
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "big.bin").write_bytes(b"\1")
    assert set(snapshot(tmp_path)) == {"app.py", ".gitignore"}


def test_changed_names_added_removed_and_modified(tmp_path: Path) -> None:
    assert changed({"a": (1, 1), "b": (1, 1)}, {"a": (2, 1), "c": (1, 1)}) == ["a", "b", "c"]
    assert changed({"a": (1, 1)}, {"a": (1, 1)}) == []


def test_a_burst_of_saves_is_one_change_and_caches_are_not(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text("x = 1\n")
    stop = threading.Event()
    seen: list[tuple[float, list[str]]] = []

    def watch() -> None:
        # quiet for 1 s: the saves 0.1 s apart stay one burst even where a loaded machine stretches a 0.1 s sleep (under
        # the full suite on 2 cores, with 0.3 s, a burst once came as two changes)
        for paths in changes(tmp_path, stop, poll_s=0.05, quiet_s=1.0):
            seen.append((time.monotonic(), paths))

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        time.sleep(0.2)
        (tmp_path / "__pycache__").mkdir()
        (tmp_path / "__pycache__" / "app.pyc").write_bytes(b"\0")  # ignored
        time.sleep(0.5)
        assert seen == []
        for i in range(5):  # saves 0.1 s apart: one burst
            _touch(app, f"x = {i}\n", bump_ns=(i + 1) * 1_000_000)
            time.sleep(0.1)
        _touch(tmp_path / "helper.py", "y = 2\n")
        last_save = time.monotonic()
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(5)
    assert [paths for _, paths in seen] == [["app.py", "helper.py"]]
    assert seen[0][0] - last_save >= 0.95  # reported once the folder was quiet, not at the first save
