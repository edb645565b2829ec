"""The Model stage's Hugging Face download: byte progress and clear errors, with no network.

Errors are built the way huggingface_hub builds them from the hub's answers (hf_raise_for_status on
a constructed HTTP response); the download itself is a local fake that writes into a cache folder
the way snapshot_download does (blobs/<sha>.incomplete, renamed when complete)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import threading
import time
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError
from huggingface_hub.hf_api import BlobLfsInfo, RepoSibling
from huggingface_hub.utils import hf_raise_for_status

from hexstudio.shared.hub import HubError, hub_error
from hexstudio.shared.protocol import Emitter
from hexstudio.workers.model import download

try:
    import httpx2 as httpx  # what this huggingface_hub uses
except ImportError:  # pragma: no cover - older huggingface_hub
    import httpx  # type: ignore[no-redef]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
API = f"https://huggingface.co/api/models/{MODEL}/revision/main"


def hub_answer(status: int, code: str | None = None, message: str | None = None) -> BaseException:
    headers = {}
    if code:
        headers["X-Error-Code"] = code
    if message:
        headers["X-Error-Message"] = message
    resp = httpx.Response(status, headers=headers, request=httpx.Request("GET", API))
    with pytest.raises(Exception) as info:
        hf_raise_for_status(resp)
    return info.value


@pytest.mark.parametrize(
    ("exc", "code", "needles"),
    [
        (
            lambda: hub_answer(403, "GatedRepo", "Access to model is restricted"),
            "gated_model",
            [f"https://huggingface.co/{MODEL}", "accept the licence"],
        ),
        (lambda: hub_answer(404, "RepoNotFound"), "model_not_found", ["spelling", "private or gated"]),
        (
            lambda: hub_answer(401, None, "Invalid credentials in Authorization header"),
            "bad_token",
            ["rejected the token", "huggingface.co/settings/tokens"],
        ),
        (lambda: hub_answer(403, None, "Forbidden"), "token_forbidden", ["403", "fine-grained"]),
        (lambda: hub_answer(429), "rate_limited", ["Wait"]),
        (lambda: hub_answer(503), "hub_unavailable", ["503", "later"]),
        (lambda: hub_answer(404, "RevisionNotFound"), "revision_not_found", ["no revision 'nope'"]),
        (
            lambda: LocalEntryNotFoundError("cannot find the requested files in the disk cache"),
            "network",
            ["Cannot reach huggingface.co", "resumes"],
        ),
        (lambda: httpx.ConnectError("[Errno -3] Temporary failure in name resolution"), "network", ["proxy"]),
        # a proxy that asks for a login: httpx's ProxyError is no NetworkError (it was not recognised at all)
        (lambda: httpx.ProxyError("407 Proxy Authentication Required"), "proxy", ["HTTPS_PROXY", "NO_PROXY"]),
        (lambda: OSError(errno.ENOSPC, "No space left on device"), "disk_full", ["HF_HOME", "Free space"]),
    ],
)
def test_hub_errors_become_clear_errors(
    exc: Any, code: str, needles: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    e = exc()
    mapped = hub_error(e, MODEL, "nope")
    assert mapped is not None, f"{type(e).__name__} was not recognised"
    assert mapped.code == code
    text = f"{mapped.message} {mapped.hint}"
    for n in needles:
        assert n in text, (n, text)
    assert "bug" not in text.lower()


def test_a_keyring_the_caller_could_not_read_is_the_hint_not_log_in() -> None:
    """The CLI and the studio read the keyring themselves: a locked one was said as "log in with `hexstudio hf
    login`", which fails against the same keyring."""
    gated = hub_error(hub_answer(401, None, "Invalid"), MODEL, has_token=False, keyring_error="it is locked")
    assert gated is not None and "keyring could not be read for the token: it is locked" in (gated.hint or "")


def test_full_disk_deep_in_the_cause_chain_is_found() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("xet reconstruction failed") from inner
    except RuntimeError as outer:
        mapped = hub_error(outer, MODEL, cache=Path("/big/hf"), need_bytes=16 * 1024**3)
    assert mapped is not None and mapped.code == "disk_full"
    assert "/big/hf" in mapped.message and "16.0 GiB" in mapped.message


def test_offline_mode_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    mapped = hub_error(LocalEntryNotFoundError("not cached"), MODEL)
    assert mapped is not None and mapped.code == "offline" and "HF_HUB_OFFLINE" in mapped.hint  # type: ignore[operator]


def test_unknown_errors_are_left_alone() -> None:
    assert hub_error(ValueError("something else"), MODEL) is None


# -- a local fake of the hub ---------------------------------------------------------------------

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": bytes(range(256)) * 4096,
    "README.md": b"not downloaded (not in the allow patterns)",
}


def fake_info(model_id: str, **_: Any) -> Any:
    """HfApi.model_info(files_metadata=True) as the hub answers it: siblings with size, blob id and LFS sha256."""
    sib = []
    for name, data in FILES.items():
        sha = hashlib.sha256(data).hexdigest()
        lfs = (
            BlobLfsInfo(size=len(data), sha256=sha, pointer_size=134)
            if name.endswith(".safetensors")
            else None
        )
        sib.append(
            RepoSibling(rfilename=name, size=len(data), lfs=lfs, blob_id=hashlib.sha1(data).hexdigest())
        )
    return SimpleNamespace(siblings=sib, sha="0" * 40)


def make_fake_snapshot(chunk: int = 64 * 1024, pause: float = 0.02, fail: BaseException | None = None) -> Any:
    def snapshot(
        model_id: str, *, revision: str | None, token: str | None, allow_patterns: list[str], cache_dir: str
    ) -> str:
        repo = Path(cache_dir) / ("models--" + model_id.replace("/", "--"))
        blobs = repo / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        snap = repo / "snapshots" / ("0" * 40)
        snap.mkdir(parents=True, exist_ok=True)
        for s in fake_info(model_id).siblings:
            if s.rfilename == "README.md":
                continue
            blob = s.lfs.sha256 if s.lfs else s.blob_id
            data = FILES[s.rfilename]
            if (blobs / blob).exists():  # cached: snapshot_download skips it
                continue
            part = blobs / f"{blob}.incomplete"
            with open(part, "wb") as fh:
                for i in range(0, len(data), chunk):
                    fh.write(data[i : i + chunk])
                    fh.flush()
                    time.sleep(pause)
                    if fail is not None and i > len(data) // 2:
                        raise fail
            part.rename(blobs / blob)
            (snap / s.rfilename).symlink_to(blobs / blob)
        return str(snap)

    return snapshot


def fetch(
    cache: Path, snapshot: Any, em: Emitter | None = None, repo_info: Any = fake_info, **kw: Any
) -> Any:
    """download() of MODEL into `cache` from a fake hub, polling every 50 ms."""
    return download(
        MODEL,
        None,
        em or Emitter(io.StringIO()),
        snapshot=snapshot,
        repo_info=repo_info,
        cache_dir=cache,
        poll_s=0.05,
        **kw,
    )


def events(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_download_reports_bytes_as_they_arrive(tmp_path: Path) -> None:
    buf = io.StringIO()
    path, rev = fetch(tmp_path, make_fake_snapshot(), em=Emitter(buf))
    assert (path / "model.safetensors").read_bytes() == FILES["model.safetensors"] and rev == "0" * 40
    total = len(FILES["config.json"]) + len(FILES["model.safetensors"])  # README.md is not fetched
    prog = [e for e in events(buf) if e["type"] == "progress" and "done_bytes" in e]
    assert len(prog) >= 5, "expected byte progress while the download runs"
    done = [e["done_bytes"] for e in prog]
    assert done == sorted(done) and 0 < done[0] < total and done[-1] == total
    assert all(e["total_bytes"] == total for e in prog)
    fractions = [e["fraction"] for e in prog]
    assert fractions == sorted(fractions) and fractions[-1] > fractions[0]
    assert "MB/s" in prog[len(prog) // 2]["message"] and "GB" in prog[-1]["message"]


def test_a_resumed_download_counts_what_is_already_there(tmp_path: Path) -> None:
    fetch(tmp_path, make_fake_snapshot(pause=0))
    buf = io.StringIO()
    fetch(tmp_path, make_fake_snapshot(pause=0), em=Emitter(buf))
    first = next(e for e in events(buf) if e["type"] == "progress" and "already here" in e["message"])
    assert "resumes" in first["message"]


def test_a_full_disk_mid_download_is_a_clear_error(tmp_path: Path) -> None:
    snap = make_fake_snapshot(fail=OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(HubError) as info:
        fetch(tmp_path, snap)
    assert info.value.code == "disk_full" and str(tmp_path) in info.value.message


def test_a_gated_model_fails_before_downloading(tmp_path: Path) -> None:
    def gated(model_id: str, **_: Any) -> Any:
        raise hub_answer(403, "GatedRepo", "Access restricted")

    called: list[int] = []

    def snapshot(*a: Any, **k: Any) -> str:
        called.append(1)
        return ""

    with pytest.raises(HubError) as info:
        download(MODEL, None, Emitter(io.StringIO()), snapshot=snapshot, repo_info=gated, cache_dir=tmp_path)
    assert info.value.code == "gated_model" and not called


def test_the_worker_reports_hub_errors_not_an_internal_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through worker_main: the error event carries the mapped code, not 'internal'."""
    import hexstudio.workers.model as wm
    from hexstudio.workers.runtime import worker_main

    def failing(model_id: str, revision: str | None, em: Emitter) -> Any:
        return download(
            model_id,
            revision,
            em,
            snapshot=make_fake_snapshot(fail=httpx.ConnectError("down")),
            repo_info=fake_info,
            cache_dir=tmp_path / "cache",
            poll_s=0.05,
        )

    monkeypatch.setattr(wm, "download", failing)
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "schema": 1,
                "stage": "model",
                "run_dir": str(tmp_path),
                "out_dir": str(tmp_path / "out"),
                "settings": {},
                "inputs": {"model": MODEL},
            }
        )
    )
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    code = worker_main("model", wm.run, ["--spec", str(spec)])
    errs = [e for e in events(out) if e["type"] == "error"]
    assert code == 1 and errs and errs[-1]["code"] == "network", errs


def test_a_repo_with_its_authors_own_copy_of_the_weights_fetches_only_the_shards(tmp_path: Path) -> None:
    """Mistral's repos hold consolidated.safetensors (the same weights, as large again) beside the Hugging Face
    shards: only the shards are fetched, counted and checked."""
    from hexstudio.workers.model import ALLOW_PATTERNS, allow_patterns, check_weights

    names = ["config.json", "consolidated.safetensors", "model-00001-of-00002.safetensors"]
    names.append("model-00002-of-00002.safetensors")
    info = SimpleNamespace(siblings=[SimpleNamespace(rfilename=n) for n in names])
    patterns = allow_patterns(info)
    assert "consolidated.safetensors" not in [n for n in names if any(fnmatch(n, p) for p in patterns)]
    assert all(any(fnmatch(n, p) for p in patterns) for n in names if n != "consolidated.safetensors")
    # a repo of one format keeps the plain patterns; not listed (offline): the same
    assert (
        allow_patterns(SimpleNamespace(siblings=[SimpleNamespace(rfilename="model.safetensors")]))
        == ALLOW_PATTERNS
    )
    assert allow_patterns(None) == ALLOW_PATTERNS
    # a folder holding both: the index's shards are the model
    from safetensors.numpy import save_file

    folder = tmp_path / "m"
    folder.mkdir()
    w = {"a": np.ones((2, 2), np.float32)}
    save_file(w, str(folder / "model-00001-of-00001.safetensors"))
    save_file({"a": np.ones((4, 4), np.float32)}, str(folder / "consolidated.safetensors"))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00001.safetensors"}})
    )
    assert check_weights(folder)["files"] == ["model-00001-of-00001.safetensors"]


def test_a_cached_model_with_its_authors_own_copy_is_used_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Downloaded online (the shards only), then offline: huggingface_hub held its cached listing, which names
    consolidated.safetensors, against the "*.safetensors" pattern and called the complete model incomplete; the
    stage said the model was not cached."""
    from safetensors.numpy import save_file

    commit = "c" * 40
    repo = tmp_path / ("models--" + MODEL.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    shard = "model-00001-of-00001.safetensors"
    save_file({"a": np.ones((2, 2), np.float32)}, str(snap / shard))
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shard}}))
    (snap / "config.json").write_text('{"model_type": "llama"}')
    listed = {"config.json", "model.safetensors.index.json", shard, "consolidated.safetensors"}
    (repo / "trees").mkdir()
    (repo / "trees" / f"{commit}.json").write_text(
        json.dumps({"format_version": 1, "files": {n: {"size": 1, "blob_id": "0" * 40} for n in listed}})
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)

    def offline(model_id: str, **_: Any) -> Any:
        raise LocalEntryNotFoundError("offline")

    path, rev = download(MODEL, None, Emitter(io.StringIO()), repo_info=offline, cache_dir=tmp_path)
    assert Path(path) == snap and rev == commit


def test_a_download_that_stalls_ends_with_a_network_error_saying_it_resumes(tmp_path: Path) -> None:
    looked_up: dict[str, Any] = {}

    def info(model_id: str, **kw: Any) -> Any:
        looked_up.update(kw)
        return fake_info(model_id)

    hang = threading.Event()

    def stalled(*_a: Any, **_k: Any) -> str:
        hang.wait(30)
        return ""

    try:
        with pytest.raises(HubError) as err:
            fetch(tmp_path, stalled, repo_info=info, stall_s=0.3)
    finally:
        hang.set()
    assert err.value.code == "network" and "stalled" in err.value.message
    assert "resumes" in (err.value.hint or "")
    assert looked_up["timeout"] > 0  # the repo lookup cannot hang either
