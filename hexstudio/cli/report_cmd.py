"""`hexstudio report RUN --format html|pdf|json --out FILE` and `hexstudio report compare RUN RUN ...`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from hexstudio.cli.common import EXIT_USAGE, CliError, add_workspace_flag, number_in, workspace_from
from hexstudio.core.runs import RunNotFound


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="write a run report (html, pdf, json) or compare runs",
        description="hexstudio report RUN --format html|pdf|json --out FILE\n"
        "hexstudio report compare RUN_A RUN_B ... --format html|pdf|json|csv --out FILE "
        "[--baseline RUN] [--timing-tolerance PCT] [--quality-tolerance PCT]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "runs", nargs="+", metavar="RUN", help="a run id or run folder; or `compare` and two or more runs"
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="default: the --out file's suffix; without --out, JSON for one run, HTML for a comparison; "
        "csv: comparisons only",
    )
    p.add_argument(
        "--baseline",
        metavar="RUN",
        default=None,
        help="compare: the run the others are set against (default: the first)",
    )
    p.add_argument(
        "--timing-tolerance",
        type=number_in(float, 0.0, 1000.0),
        default=None,
        metavar="PCT",
        help="compare: timings and memory within this %% are the same (default 10; a measured "
        "run-to-run spread counts where it is larger)",
    )
    p.add_argument(
        "--quality-tolerance",
        type=number_in(float, 0.0, 1000.0),
        default=None,
        metavar="PCT",
        help="compare: quality figures within this %% are the same (default 2)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output file (default: stdout for json, else required)"
    )
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument(
        "--redact-hosts",
        dest="redact_hosts",
        action="store_true",
        default=None,
        help="leave host and user names out (default: the include_host_in_reports setting)",
    )
    hosts.add_argument(
        "--include-hosts", dest="redact_hosts", action="store_false", help="show host and user names"
    )
    add_workspace_flag(p)
    p.set_defaults(func=cmd_report)


def _run_dir(args: argparse.Namespace, ref: str) -> Path:
    """A run given by its id (in the workspace) or its folder, as an absolute path; a run whose process died
    mid-stage is marked interrupted either way, so its report never says it is still running."""
    p = Path(ref).expanduser()
    if (p / "run.json").is_file():
        from hexstudio.core.runs import load_run

        # as the workspace opens a run: written only under the run's lock, never over a live runner's run.json
        return load_run(p.resolve()).run_dir
    try:
        return workspace_from(args).open_run(ref).run_dir
    except RunNotFound as exc:
        raise CliError(str(exc), "List runs with `hexstudio runs list`, or give the run folder.") from None


def _redact_hosts(args: argparse.Namespace) -> bool:
    if args.redact_hosts is not None:
        return bool(args.redact_hosts)
    from hexstudio.core.settings import Settings

    try:
        return not bool(Settings.load().data.get("include_host_in_reports", False))
    except Exception:  # an unreadable settings file: err on the side of privacy
        return True


FORMATS = ("html", "pdf", "json", "csv")


def _report_format(args: argparse.Namespace) -> str:
    """--format, else what --out's suffix says (report.pdf is a PDF, not HTML with a .pdf name), else JSON on
    stdout for one run and HTML for a comparison; a --format the suffix contradicts is refused."""
    suffix = args.out.suffix.lower().lstrip(".") if args.out is not None else ""
    if args.format is not None:
        if suffix in FORMATS and suffix != args.format:
            raise CliError(
                f"--format {args.format} does not match --out {args.out.name} (a .{suffix} file).",
                f"Name the file .{args.format}, or leave --format out: the suffix says it.",
                exit_code=EXIT_USAGE,
            )
        return str(args.format)
    if suffix in FORMATS:
        return suffix
    if suffix == "htm":
        return "html"
    if suffix:  # report.md, report.txt: HTML under that name would surprise whoever opens it
        raise CliError(
            f"--out {args.out.name}: HexStudio writes reports as {', '.join(FORMATS)}, not .{suffix}.",
            f"Name the file with one of those suffixes, or give --format ({'|'.join(FORMATS)}).",
            exit_code=EXIT_USAGE,
        )
    return "html" if args.out is not None or args.runs[0] == "compare" else "json"


def _check_out(out: Path) -> None:
    """--out names a file in a folder that exists and can be written: no folder is ever created for it (issue 27:
    `--out /nonexistent/dir/r.html` made folders at the filesystem root, `--out <a folder>` ended in a traceback)."""
    if out.is_dir():
        raise CliError(
            f"--out {out} is a folder; give a file name.", f"For example --out {out / 'report.html'}"
        )
    parent = out.parent if str(out.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise CliError(
            f"{parent} is a file, not a folder, so {out.name} cannot be written in it.",
            "Give --out a file in an existing folder.",
        )
    if not parent.is_dir():
        raise CliError(
            f"The folder {parent} does not exist, so {out.name} cannot be written there.",
            "Create the folder first, or give --out a file in an existing folder.",
        )
    if not os.access(parent, os.W_OK):
        raise CliError(
            f"The folder {parent} cannot be written to.", "Give --out a file in a folder you can write."
        )


def cmd_report(args: argparse.Namespace) -> int:
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.compare import compare_html, compare_reports, write_compare
    from hexstudio.core.reports.render import ReportError, validate_report, write

    args.redact_hosts = _redact_hosts(args)
    args.format = _report_format(args)
    if args.out is not None:
        _check_out(args.out)
    try:
        if args.runs[0] == "compare":
            if len(args.runs) < 3:
                raise CliError(
                    "Compare needs two or more runs.",
                    "hexstudio report compare RUN_A RUN_B ...",
                    exit_code=EXIT_USAGE,
                )
            reports = [build_report(_run_dir(args, r), redact_hosts=args.redact_hosts) for r in args.runs[1:]]
            baseline = 0
            if args.baseline:
                dirs = [_run_dir(args, r).resolve() for r in args.runs[1:]]
                # the baseline by its id or its folder, whichever way the runs were given
                named = [d for d in dirs if d.name == args.baseline]
                want = named[0] if named else _run_dir(args, args.baseline).resolve()
                if want not in dirs:
                    raise CliError(
                        f"--baseline {args.baseline} is not one of the compared runs.",
                        "Give one of the runs after `compare`.",
                    )
                baseline = dirs.index(want)
            timing = 10.0 if args.timing_tolerance is None else args.timing_tolerance
            quality = 2.0 if args.quality_tolerance is None else args.quality_tolerance
            c = compare_reports(reports, baseline, timing / 100, quality / 100)
            if args.out is None:
                if args.format == "pdf":
                    raise CliError("--format pdf needs --out FILE.", exit_code=EXIT_USAGE)
                if args.format == "csv":
                    from hexstudio.core.reports.noise import compare_csv

                    print(compare_csv(c), end="")
                    return 0
                print(
                    json.dumps(c, indent=2, ensure_ascii=False) if args.format == "json" else compare_html(c)
                )
                return 0
            write_compare(c, args.format, args.out)
            print(f"wrote {args.out} ({len(reports)} runs, {len(c['rows'])} rows in common)", file=sys.stderr)
            return 0
        if args.format == "csv":
            raise CliError(
                "--format csv is for comparisons (`hexstudio report compare RUN_A RUN_B ...`).",
                "For one run use html, pdf or json.",
                exit_code=EXIT_USAGE,
            )
        if len(args.runs) != 1:
            raise CliError("Give one run (or `compare` and two or more).", exit_code=EXIT_USAGE)
        flags = {
            "--baseline": args.baseline,
            "--timing-tolerance": args.timing_tolerance,
            "--quality-tolerance": args.quality_tolerance,
        }
        if given := [f for f, v in flags.items() if v is not None]:  # silently ignored, they would mislead
            raise CliError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for comparisons; a one-run report has "
                "no baseline or tolerance.",
                "hexstudio report compare RUN_A RUN_B ... " + " ".join(given) + " ...",
                exit_code=EXIT_USAGE,
            )
        rep = build_report(_run_dir(args, args.runs[0]), redact_hosts=args.redact_hosts)
        try:
            validate_report(rep)
        except ReportError as exc:  # a HexStudio bug: said, and the report is still written
            print(f"warning: {exc.message}\n  {exc.hint}", file=sys.stderr)
        if args.out is None:
            if args.format != "json":
                raise CliError(f"--format {args.format} needs --out FILE.", exit_code=EXIT_USAGE)
            print(json.dumps(rep, indent=2, ensure_ascii=False))
            return 0
        write(rep, args.format, args.out)
        print(f"wrote {args.out} (run {rep['run']['status']})", file=sys.stderr)
        return 0
    except ReportError as exc:
        raise CliError(exc.message, exc.hint) from None
