"""QAIRT runtime install from the SDK zip on the workstation (facts/board.md).

Only what the board needs leaves the workstation: from `qairt/<ver>/` in the zip, the
aarch64-oe-linux-gcc11.2 binaries and libraries (plus lib/aarch64-oe-linux-gcc8.2 for libatomic when
the SDK has it) and lib/hexagon-<dsp_arch>/unsigned — packed into one tar here, uploaded resumably,
unpacked as root into /opt/qairt/<ver>.partial, made world-readable, renamed to /opt/qairt/<ver>,
and /opt/qairt/current pointed at it; then ~/qairt-env.sh is written. A marker file
(`.hexstudio-install`) records a digest of the selected members, so a second install does nothing.

Versions: `compare_qairt(board_version, bundle_version)` says ok / warn / refuse: a board QAIRT older
than the one that compiled the bundle cannot load its context binaries (err 5000); 2.38 has a known
Genie issue.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import zipfile
from pathlib import Path

from hexstudio.core.atomic import atomic_writer
from hexstudio.core.device.errors import BoardError

QAIRT_BASE = "/opt/qairt"
MARKER = ".hexstudio-install"
ABI = "aarch64-oe-linux-gcc11.2"
ABI_OLD = "aarch64-oe-linux-gcc8.2"


def parse_version(text: str) -> tuple[int, ...]:
    """'2.45.0.260326' / 'v2.40.0.251030114326_189385' / '2.45.0.260326154327' -> (2, 45, 0)."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        raise ValueError(f"not a QAIRT version: {text!r}")
    return tuple(int(g) for g in m.groups(default="0"))


def compare_qairt(board_version: str | None, bundle_version: str | None) -> tuple[str, str]:
    """(status ok|warn|refuse, message) for running a bundle compiled with `bundle_version` on a board
    whose QAIRT is `board_version`."""
    if bundle_version is None:
        return "ok", "The bundle does not name the QAIRT that compiled it."
    if board_version is None:
        return "refuse", (
            f"The board has no QAIRT; the bundle was compiled with QAIRT {bundle_version}: "
            f"install QAIRT {'.'.join(map(str, parse_version(bundle_version)))} or newer."
        )
    b, c = parse_version(board_version), parse_version(bundle_version)
    if b < c:
        return "refuse", (
            f"The board's QAIRT {board_version} is older than the QAIRT {bundle_version} that compiled "
            "the bundle: its context binaries would fail to load (`Could not create context from "
            f"binary ... err 5000`). Install QAIRT {'.'.join(map(str, c))} or newer on the board."
        )
    if b[:2] == (2, 38):
        return "warn", f"QAIRT {board_version} has a known Genie issue: prefer another version."
    if b[:2] != c[:2]:
        return "warn", (
            f"The board's QAIRT {board_version} is newer than the bundle's {bundle_version}: usually "
            "fine; if the context fails to load, install the same version."
        )
    return "ok", f"The board's QAIRT {board_version} can run a bundle compiled with {bundle_version}."


def select_members(zip_path: Path, dsp_arch: str = "v73") -> tuple[str, list[zipfile.ZipInfo], str]:
    """(version, the members the board needs, their digest) from a QAIRT SDK zip."""
    try:
        z = zipfile.ZipFile(zip_path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BoardError(
            f"{zip_path} is not a readable zip ({exc}).",
            "Use the QAIRT SDK zip as downloaded from Qualcomm (v<version>.zip).",
        ) from None
    with z:
        roots = {mt.group(1) for n in z.namelist() if (mt := re.match(r"qairt/([0-9][^/]*)/", n))}
        if len(roots) != 1:
            raise BoardError(
                f"{zip_path.name} does not look like a QAIRT SDK (expected one qairt/<version>/ "
                f"folder, found {sorted(roots) or 'none'}).",
                "Use the QAIRT SDK zip from Qualcomm; it unzips to qairt/<version>/.",
            )
        version = roots.pop()
        root = f"qairt/{version}/"
        wanted = (f"bin/{ABI}/", f"lib/{ABI}/", f"lib/{ABI_OLD}/", f"lib/hexagon-{dsp_arch}/unsigned/")
        members = []
        for info in z.infolist():
            if info.is_dir() or not info.filename.startswith(root):
                continue
            rel = info.filename[len(root) :]
            if rel.startswith(wanted) or "/" not in rel:
                members.append(info)
    rels = {m.filename[len(root) :] for m in members}
    missing = [
        p
        for p in (
            f"bin/{ABI}/genie-t2t-run",
            f"lib/{ABI}/libGenie.so",
            f"lib/{ABI}/libQnnHtp.so",
            f"lib/hexagon-{dsp_arch}/unsigned/libQnnHtp{dsp_arch.upper()}Skel.so",
        )
        if p not in rels
    ]
    if missing:
        raise BoardError(
            f"The QAIRT SDK {version} lacks what the board needs: {', '.join(missing)}.",
            f"Use a QAIRT SDK with {ABI} binaries and the hexagon-{dsp_arch} skel.",
        )
    h = hashlib.sha256(f"{version} {dsp_arch}\n".encode())
    for m in sorted(members, key=lambda i: i.filename):
        h.update(f"{m.filename} {m.CRC:08x} {m.file_size}\n".encode())
    return version, members, h.hexdigest()


def build_payload(zip_path: Path, dsp_arch: str, out_dir: Path) -> tuple[str, Path, str, int]:
    """Pack the selected members into <out_dir>/qairt-<ver>-<arch>-<digest12>.tar (reused when present).
    Returns (version, tar path, digest, number of files)."""
    version, members, digest = select_members(zip_path, dsp_arch)
    out_dir.mkdir(parents=True, exist_ok=True)
    tar_path = out_dir / f"qairt-{version}-{dsp_arch}-{digest[:12]}.tar"
    if _whole_tar(tar_path):
        return version, tar_path, digest, len(members) + 1
    root = f"qairt/{version}/"
    with (
        zipfile.ZipFile(zip_path) as z,
        atomic_writer(tar_path, "wb", encoding=None) as fh,  # fsynced: never a truncated tar reused
        tarfile.open(fileobj=fh, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for m in sorted(members, key=lambda i: i.filename):
            ti = tarfile.TarInfo(m.filename[len(root) :])
            ti.size = m.file_size
            mode = (m.external_attr >> 16) & 0o777
            ti.mode = mode or (0o755 if "/bin/" in f"/{ti.name}" else 0o644)
            ti.mtime = 0
            with z.open(m) as src:
                tar.addfile(ti, src)
        marker = json.dumps(
            {"version": version, "dsp_arch": dsp_arch, "digest": digest, "installed_by": "hexstudio"}
        ).encode()
        ti = tarfile.TarInfo(MARKER)
        ti.size = len(marker)
        ti.mode = 0o644
        tar.addfile(ti, io.BytesIO(marker))
    return version, tar_path, digest, len(members) + 1


def _whole_tar(p: Path) -> bool:
    """A tar written to its end (tarfile closes one with two zero blocks, padded to whole blocks): one a crash cut
    short is built again, not uploaded to fail on the board with "Unexpected EOF"."""
    try:
        size = p.stat().st_size
        if size < 1024 or size % 512:
            return False
        with open(p, "rb") as fh:
            fh.seek(size - 1024)
            return fh.read(1024) == bytes(1024)
    except OSError:
        return False
