"""A local fake of the Hugging Face Hub on 127.0.0.1, for huggingface_hub itself to talk to (HF_ENDPOINT).

It answers the requests huggingface_hub really makes for `hf_hub_download`, `snapshot_download` and
`HfApi.model_info`: the repo info (`/api/models/{id}/revision/{rev}`), the tree listing
(`/api/models/{id}/tree/{rev}`), and HEAD/GET `/{id}/resolve/{rev}/{file}` with the headers the real hub
sends (X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size). Revisions are branches or tags mapped to
commits, each with its own files. It records every request's path and Authorization header, and can play
a gated model (no token or the wrong one: 401/403 with the hub's X-Error-Code), so a test can prove which
token and revision a HexStudio command used. Never the network: it binds loopback only.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse


@dataclass
class FakeRepo:
    repo_id: str
    commits: dict[str, dict[str, bytes]]  # commit sha -> {filename: content}
    refs: dict[str, str]  # branch/tag -> commit sha
    gated_token: str | None = None  # when set, only this token may read it

    def commit_of(self, rev: str) -> str | None:
        if rev in self.commits:
            return rev
        return self.refs.get(rev)


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add_repo(
        self, repo_id: str, revisions: dict[str, dict[str, bytes]], gated_token: str | None = None
    ) -> None:
        """revisions: ref name -> files. Each ref gets its own commit (a sha1 of its content)."""
        commits: dict[str, dict[str, bytes]] = {}
        refs: dict[str, str] = {}
        for ref, files in revisions.items():
            h = hashlib.sha1(ref.encode())
            for name in sorted(files):
                h.update(name.encode() + files[name])
            commits[h.hexdigest()] = files
            refs[ref] = h.hexdigest()
        self.repos[repo_id] = FakeRepo(repo_id, commits, refs, gated_token)

    def tokens_seen(self) -> set[str | None]:
        return {s.authorization for s in self.seen}

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                return None

            def do_HEAD(self) -> None:
                self._answer(head=True)

            def do_GET(self) -> None:
                self._answer(head=False)

            def _send(
                self,
                status: int,
                body: bytes = b"",
                headers: dict[str, str] | None = None,
                head: bool = False,
            ) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, status: int, code: str | None, message: str, head: bool) -> None:
                h = {"X-Error-Message": message, "Content-Type": "application/json"}
                if code:
                    h["X-Error-Code"] = code
                self._send(status, json.dumps({"error": message}).encode(), h, head)

            def _answer(self, head: bool) -> None:
                url = urlparse(self.path)
                auth = self.headers.get("Authorization")
                hub.seen.append(Seen(self.command, unquote(url.path), auth))
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                    repo_id, kind, rev, rest = "/".join(parts[2:4]), parts[4], parts[5], parts[6:]
                elif len(parts) >= 5 and parts[2] == "resolve":
                    repo_id, kind, rev, rest = "/".join(parts[:2]), "resolve", parts[3], parts[4:]
                else:
                    return self._error(404, None, "Not Found", head)
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._error(401, "RepoNotFound", "Repository not found", head)
                if repo.gated_token is not None and auth != f"Bearer {repo.gated_token}":
                    return self._error(
                        401 if auth is None else 403,
                        "GatedRepo",
                        "Access to model is restricted. You must have access to it and be "
                        "authenticated to access it.",
                        head,
                    )
                commit = repo.commit_of(rev)
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                files = repo.commits[commit]
                if kind == "revision":
                    sib = [
                        {"rfilename": n, "size": len(b), "blobId": _git_oid(b), **_lfs_entry(n, b, "sha256")}
                        for n, b in sorted(files.items())
                    ]
                    body = json.dumps(
                        {
                            "id": repo_id,
                            "modelId": repo_id,
                            "sha": commit,
                            "private": False,
                            "gated": repo.gated_token is not None,
                            "siblings": sib,
                        }
                    ).encode()
                    return self._send(200, body, {"Content-Type": "application/json"}, head)
                if kind == "tree":
                    tree = [
                        {
                            "type": "file",
                            "path": n,
                            "size": len(b),
                            "oid": _git_oid(b),
                            **_lfs_entry(n, b, "oid"),
                        }
                        for n, b in sorted(files.items())
                    ]
                    return self._send(
                        200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head
                    )
                name = "/".join(rest)
                if name not in files:
                    return self._error(404, "EntryNotFound", f"{name} does not exist on {rev}", head)
                data = files[name]
                etag = _sha(data) if _lfs(name) else _git_oid(data)
                headers = {
                    "X-Repo-Commit": commit,
                    "ETag": f'"{etag}"',
                    "Accept-Ranges": "bytes",
                    "Content-Type": "application/octet-stream",
                }
                if _lfs(name):
                    headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and not head:
                    start = int(rng[6:].split("-")[0] or 0)
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    return self._send(206, data[start:], headers)
                return self._send(200, data, headers, head)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="fake-hub", daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _lfs(name: str) -> bool:
    return name.endswith(".safetensors")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _lfs_entry(name: str, data: bytes, sha_key: str) -> dict[str, Any]:
    """A file listing's `lfs` entry for a file kept in LFS, else none; the listing names its sha256 `sha_key`
    ("sha256" in a model's siblings, "oid" in a tree)."""
    return {"lfs": {sha_key: _sha(data), "size": len(data), "pointerSize": 134}} if _lfs(name) else {}


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def folder_files(folder: Path, skip: tuple[str, ...] = ("training.json",)) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name not in skip}


def hub_env(hub: FakeHub, hf_home: Path) -> dict[str, str]:
    """The environment a child process needs to use this hub and a private HF cache (never the user's)."""
    return {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
    }
