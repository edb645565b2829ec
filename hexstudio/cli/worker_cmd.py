"""`hexstudio worker add|list|password|check|remove`: worker hosts, Linux machines over SSH that run the
heavy stages (quantize, validate) of runs started with `hexstudio run --worker-host NAME`."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hexstudio.cli import ssh
from hexstudio.cli.common import EXIT_FAILED, EXIT_USAGE, CliError, add_actions, print_json, set_action
from hexstudio.core.remote.hosts import (
    STAGE_PACKAGES,
    WorkerHostError,
    check_host,
    connect_worker_host,
    host_config,
    worker_hosts,
)
from hexstudio.core.remote.sync import host_python, install_workers
from hexstudio.core.secrets import delete_secret, set_secret, worker_password_key
from hexstudio.core.settings import Settings, SettingsError, check_machine_name


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ws = add_actions(
        sub,
        "worker",
        help="worker hosts: Linux machines over SSH that run quantize/validate for "
        "runs started with --worker-host",
    )

    pa = ws.add_parser("add", help="add or change a worker host (host, port, user, auth, python)")
    pa.add_argument("name")
    ssh.add_ssh_flags(pa)
    pa.add_argument(
        "--python",
        default=None,
        help="the Python that runs the workers there (default python3; use the environment "
        "packaging/install-workstation.sh made, e.g. ~/hexstudio/.venv/bin/python)",
    )
    pa.add_argument(
        "--root",
        default=None,
        help="folder on the host for HexStudio's workers and run copies (default ~/.cache/hexstudio)",
    )
    pa.add_argument("--no-connect", action="store_true", help="save only; do not connect and check")
    ssh.add_trust_flag(pa, "host")
    set_action(pa, cmd_add)

    pl = ws.add_parser("list", help="list the worker hosts")
    set_action(pl, cmd_list)

    pw = ws.add_parser("password", help="store the worker host's SSH password in the system keyring")
    pw.add_argument("name")
    pw.add_argument("--stdin", action="store_true", help="read it from stdin instead of a prompt")
    pw.set_defaults(func=cmd_password)

    pc = ws.add_parser(
        "check", help="connect, check Python and the packages each stage needs, install the workers"
    )
    pc.add_argument("name")
    ssh.add_trust_flag(pc, "host")
    set_action(pc, cmd_check)

    pr = ws.add_parser("remove", help="forget a worker host (and its stored password)")
    pr.add_argument("name")
    pr.set_defaults(func=cmd_remove)


async def _check(name: str, cfg: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Connect (asking about an unknown host key), probe Python and every stage's packages, install the
    workers. Raises CliError with what to do."""
    try:
        t = await connect_worker_host(name, cfg, trust=ssh.host_key_prompt(args, "host"))
    except WorkerHostError as exc:
        raise CliError(exc.message, exc.hint) from None
    try:
        python = host_python(cfg.get("python"), await t.home())
        info = await check_host(t, name, python)
        stages: dict[str, Any] = {}
        for stage, mods in STAGE_PACKAGES.items():
            try:
                await check_host(t, name, python, mods)
                stages[stage] = {"ok": True}
            except WorkerHostError as exc:
                stages[stage] = {"ok": False, "message": exc.message, "hint": exc.hint}
        root = await install_workers(t, cfg.get("root") or None)
        return {
            "ok": all(s["ok"] for s in stages.values()),
            "host": name,
            "label": t.label,
            "python": ".".join(map(str, info["python"])),
            "executable": info["executable"],
            "cpu_count": info["cpu_count"],
            "memory_bytes": info["memory_bytes"],
            "workers": root,
            "stages": stages,
        }
    except WorkerHostError as exc:
        raise CliError(exc.message, exc.hint) from None
    finally:
        await t.close()


def _print_check(doc: dict[str, Any]) -> None:
    print(
        f"{doc['host']} ({doc['label']}): Python {doc['python']} ({doc['executable']}), {doc['cpu_count']} CPUs, "
        f"{(doc['memory_bytes'] or 0) / 2**30:.1f} GiB RAM; workers in {doc['workers']}"
    )
    for stage, st in doc["stages"].items():
        if st["ok"]:
            print(f"  ok    {stage}")
        else:
            print(f"  FAIL  {stage}: {st['message']}")
            print(f"        what to do: {st['hint']}")


def cmd_add(args: argparse.Namespace) -> int:
    if args.name == "local":
        raise CliError(
            "'local' means this machine and cannot name a worker host.",
            "Pick another name.",
            exit_code=EXIT_USAGE,
        )
    try:
        # the name goes into settings, keyring entries and file names
        check_machine_name(args.name, "worker host", "gpu-box")
    except SettingsError as exc:
        raise CliError(exc.message, exc.hint, exit_code=EXIT_USAGE) from None
    ssh.check_ssh_flags(args, "worker host")
    entry = ssh.ssh_config_from(args, python=args.python, root=args.root)
    s = Settings.edit(lambda s: worker_hosts(s).__setitem__(args.name, entry))  # one edit at a time
    # saved before the check: a host that is off now is still worth keeping ("saved" says so to a script)
    out: dict[str, Any] = {
        "ok": True,
        "saved": True,
        "worker_host": args.name,
        "config": worker_hosts(s)[args.name],
    }
    if not args.no_connect:
        try:
            out["check"] = asyncio.run(_check(args.name, worker_hosts(s)[args.name], args))
        except CliError as exc:
            raise ssh.kept_but_unreachable(
                exc, f"Worker host {args.name} is saved", "worker", "check", args.name
            ) from None
        out["ok"] = out["check"]["ok"]
    if args.json:
        print_json(out)
    else:
        print(f"worker host {args.name} saved")
        if "check" in out:
            _print_check(out["check"])
    return 0 if out["ok"] else EXIT_FAILED


def cmd_list(args: argparse.Namespace) -> int:
    hosts = worker_hosts(Settings.load())
    rows = [{"name": n, **cfg} for n, cfg in sorted(hosts.items())]
    if args.json:
        print_json({"worker_hosts": rows})
    elif not rows:
        print("no worker hosts (add one: hexstudio worker add NAME --host HOST --user USER --key KEY)")
    else:
        for r in rows:
            print(
                f"{r['name']:16s} {r.get('user') or ''}@{r.get('host')}:{r.get('port', 22)} ({r.get('auth')}), "
                f"python {r.get('python') or 'python3'}"
            )
    return 0


def cmd_password(args: argparse.Namespace) -> int:
    try:
        host_config(args.name)
    except WorkerHostError as exc:
        raise CliError(exc.message, exc.hint) from None
    pw = ssh.read_password(
        f"SSH password for {args.name}: ", args.stdin, f"hexstudio worker password {args.name}"
    )
    set_secret(worker_password_key(args.name), pw)
    from hexstudio.core.secrets import stored_where

    print(f"SSH password for worker host {args.name} stored {stored_where()}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    try:
        cfg = host_config(args.name)
    except WorkerHostError as exc:
        raise CliError(exc.message, exc.hint) from None
    doc = asyncio.run(_check(args.name, cfg, args))
    if args.json:
        print_json(doc)
    else:
        _print_check(doc)
    return 0 if doc["ok"] else EXIT_FAILED


def cmd_remove(args: argparse.Namespace) -> int:
    if args.name not in worker_hosts(Settings.load()):
        raise CliError(f"No worker host named '{args.name}'.", "`hexstudio worker list` shows them.")
    Settings.edit(lambda s: worker_hosts(s).pop(args.name, None))
    delete_secret(worker_password_key(args.name))
    print(f"worker host {args.name} removed")
    return 0
