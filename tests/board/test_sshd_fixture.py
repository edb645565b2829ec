"""The test sshd itself: a real OpenSSH client logs in with the generated key and trusted host key."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.sshd import SshServer


def test_openssh_client_logs_in(ssh_server: SshServer) -> None:
    out = subprocess.run(
        ssh_server.ssh_argv("echo", "hello-$USER"), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hello-root"
    assert ssh_server.host_key_fingerprint.startswith("SHA256:")
    assert ssh_server.known_hosts_line.startswith(f"[127.0.0.1]:{ssh_server.port} ssh-ed25519 ")


def test_namespaced_server_sees_private_opt(tmp_path: Path) -> None:
    opt = tmp_path / "opt"
    opt.mkdir()
    (opt / "only-in-namespace").write_text("x")
    with SshServer(tmp_path / "srv", setup_script=f"mount --bind {opt} /opt") as srv:
        out = subprocess.run(srv.ssh_argv("ls", "/opt"), capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "only-in-namespace" in out.stdout
    assert not Path("/opt/only-in-namespace").exists()
