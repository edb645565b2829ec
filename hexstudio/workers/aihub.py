"""Compile through Qualcomm AI Hub (compile target "aihub"), with the real `qai_hub` client, the way
qai-hub-models builds AI Hub's own Genie bundles (quic/ai-hub-models,
qai_hub_models/models/_shared/llm/export.py and model.py; docs/compile.md):

- per graph, a directory `<model>_<prompt|token>_<i>_of_<n>.aimet/` holding `<same>.onnx` (its external
  data location renamed), `<same>.data` and `<same>.encodings`, uploaded with `upload_model(dir)`; the
  integer-encoded weights (int4/int8 in int8) and the embedding table (uint16) as their integers, which
  re-quantize to the same integers (hexstudio/workers/aihub_upload.py, docs/aihub-upload.md): about a quarter
  of the bytes of fp32 (setting aihub_compact_upload off: fp32); the size and an ETA are shown before the
  first upload;
- per graph a compile job named `<model>_<prompt|token>_<i>_of_<n>` with `--target_runtime qnn_dlc
  --qairt_version V --output_names <the graph's outputs> --quantize_io --qnn_options
  context_enable_graphs=<graph> --quantize_full_type w8a16`;
- per part a link job `<model>_part_<i>_of_<n>` joining [prompt DLC, token DLC] (`--qairt_version V`),
  whose context binary is downloaded as `<model>_part_<i>_of_<n>.bin`;
- tool-versions.yaml holds only `qairt: <full version>`, read from the link job's compiled model
  (metadata QAIRT_SDK_VERSION, as qai-hub-models' ToolVersions.from_compiled_model does);
- metadata.yaml (hexstudio/workers/bundle_metadata.py), genie_config.json, htp_backend_ext_config.json and the
  checkpoint's tokenizer.json, tokenizer_config.json and config.json complete the bundle.

Resume: every submitted job id is written at once (atomically) to `<run>/aihub_jobs.json`, which
survives the pipeline deleting the stage's partial folder. A restarted compile with the same inputs
waits for / downloads those jobs instead of submitting again. A failed job is dropped from the file
(and kept under "failed"), so resuming submits only that one again.

Settings (spec.settings): device, qairt_version, aihub_consent (must be true before any upload),
aihub_poll_interval_s (default 15), aihub_api_url / aihub_web_url (default: the token's
client.ini, else app.aihub.qualcomm.com), aihub_http_retries / aihub_http_backoff_s (the client's
connection/429 retries; tests set 0), aihub_compile_options (appended to every compile job's
options, like qai-hub-models' --compile-options), aihub_model_name (the `<model>` in file and job names; default
from the model id). Token: $HEXSTUDIO_AIHUB_TOKEN (the studio passes it from the keyring), else an
existing qai_hub client.ini ($QAIHUB_CLIENT_INI or ~/.qai_hub/client.ini).

An emulated AI Hub (tests/aihub_emulator: devices carry `hexstudio:emulated`, binaries are zips
with emulated.json) makes everything here labeled "emulated": true.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexstudio.shared import bundle as gb
from hexstudio.shared import modelinfo
from hexstudio.shared.aihub_devices import AihubDevice, DeviceListing
from hexstudio.shared.bundle.speculative import DraftHost
from hexstudio.shared.errors import keyring_unread
from hexstudio.shared.protocol import Emitter
from hexstudio.shared.run_settings import RunSettings
from hexstudio.workers import bundle_metadata as gm
from hexstudio.workers.aihub_uplink import UplinkRate, read_rate, record_rate
from hexstudio.workers.aihub_upload import UploadError, UploadStats, plan_bytes, write_upload_dir
from hexstudio.workers.bundle_json import write_bundle_json
from hexstudio.workers.genie_config import check_speculative, checked_genie_config, write_dialog_configs
from hexstudio.workers.runtime import WorkerError, WorkerSpec

JOBS_FILE = "aihub_jobs.json"
EMULATED_ATTRIBUTE = "hexstudio:emulated"
DEFAULT_POLL_S = 15.0
MIN_QUALCOMM_POLL_S = 5.0  # the shortest poll interval used against Qualcomm's own AI Hub
KINDS = ("prompt_processor", "token_generator")
TOKEN_WHERE = "the Compile page's AI Hub token field, or `hexstudio aihub login`"
RESUME_HINT = (
    "Resume the run when that is fixed: jobs already submitted are kept in the run's "
    f"{JOBS_FILE} and are not submitted again."
)


# -- small helpers -----------------------------------------------------------------------------
def write_json_atomic(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def model_name(model_doc: dict[str, Any], settings: RunSettings | None = None) -> str:
    """The `<model>` of file and job names, like qai-hub-models' model ids and the simulation bundle's
    (hexstudio.shared.bundle.model_slug): "meta-llama/Llama-3.1-8B-Instruct" -> "llama_3_1_8b_instruct",
    "builtin:tiny-llama" -> "tiny_llama" (setting aihub_model_name overrides)."""
    return gb.model_slug(
        str((settings.aihub_model_name if settings else "") or model_doc["model"]).replace("builtin:", "")
    )


def part_suffix(graph: str) -> str:
    """ "prompt_ar128_cl512_1_of_2" -> "1_of_2" (the graph name's own zero padding)."""
    return gm.component_name(graph).split("_", 1)[1]


def graph_job_name(model: str, graph: str, main: tuple[int, int] | None = None) -> str:
    """The compile job and upload name of a graph: `<model>_<prompt|token>_<i>_of_<n>`, and for another AR or
    CL than the bundle's `main` (AR, CL) its metadata component's suffix (`..._1_of_2_ar4_cl128`)."""
    return f"{model}_{gm.variant_component(graph, *main) if main else gm.component_name(graph)}"


def part_name(model: str, graph: str) -> str:
    """The link job of the graph's part, and its context binary without `.bin`: `<model>_part_<i>_of_<n>`."""
    return f"{model}_part_{part_suffix(graph)}"


def bin_name(model: str, graph: str) -> str:
    return f"{part_name(model, graph)}.bin"


def compile_options(graph: str, qairt_version: str, output_names: list[str]) -> str:
    """qai-hub-models' compile options for one graph of a Genie LLM (LLM_AIMETOnnx.get_hub_compile_options),
    each once, with this graph's own outputs as --output_names."""
    return (
        f"--target_runtime qnn_dlc --qairt_version {qairt_version} --output_names {','.join(output_names)} "
        f"--quantize_io --qnn_options context_enable_graphs={graph} --quantize_full_type w8a16"
    )


def link_options(qairt_version: str) -> str:
    return f"--qairt_version {qairt_version}"


def parse_device(name: str, os_name: str, attributes: list[str]) -> dict[str, Any]:
    """A device record as the bundle and the checks want it, from AI Hub's attributes."""
    attrs: dict[str, str] = {}
    for a in attributes:  # the first of a repeated key wins
        if ":" in a:
            attrs.setdefault(a.split(":", 1)[0], a.split(":", 1)[1])
    # AI Hub names a chipset twice (chipset:qualcomm-qcs9075 and its alias chipset:qcs9075), in no promised
    # order: the vendor-prefixed name is the chipset, wherever it stands
    chipsets = [a.split(":", 1)[1] for a in attributes if a.startswith("chipset:")]
    chipset = next((c for c in chipsets if c.startswith("qualcomm-")), attrs.get("chipset"))
    known = gb.KNOWN_DEVICES.get(name, {})
    soc = attrs.get("soc-model")
    ws = attrs.get("htp-supports-weight-sharing")
    return {
        "name": name,
        "os": os_name,
        "soc_model": int(soc) if soc and soc.isdigit() else known.get("soc_model", 0),
        "dsp_arch": attrs.get("hexagon", known.get("dsp_arch", "unknown")),
        "chipset": chipset or known.get("chipset"),
        "weight_sharing": (ws == "true") if ws is not None else bool(known.get("weight_sharing", False)),
        "attributes": list(attributes),
        "emulated": EMULATED_ATTRIBUTE in attributes,
    }


def is_emulated_package(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return "emulated.json" in z.namelist() and bool(
                json.loads(z.read("emulated.json")).get("emulated")
            )
    except (zipfile.BadZipFile, OSError, ValueError, KeyError):
        return False


def _chain_text(exc: BaseException) -> str:
    out, seen = [], set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return " | ".join(out)


_STATUS_429 = re.compile(r"(?<![\w:/.=])429(?!\w)")


def says_429(text: str) -> bool:
    """Whether an error chain reports HTTP 429 (urllib3's "too many 429 error responses", "429 Too Many
    Requests"): the status, not the digits 429 inside a port, an address or an id (an emulator on port 42913
    once read as rate-limiting)."""
    return "too many requests" in text.lower() or _STATUS_429.search(text) is not None


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip(" |│┌┐└┘─") for ln in str(exc).splitlines()]
    return " ".join(ln for ln in lines if ln)[:400] or type(exc).__name__


# how long one wait for a set of jobs may last (an 8B part compiles in well under an hour on AI Hub)
WAIT_LIMIT_S = 24 * 3600.0
# looking up a job whose submit did not answer: AI Hub's clock may differ from this machine's by this much,
# and the account's newest jobs of the kind are read in pages, at most this many
CLOCK_SKEW_S = 600.0
LOOKUP_PAGE, LOOKUP_PAGES = 50, 10


# -- client ------------------------------------------------------------------------------------
def poll_interval(settings: RunSettings, api_url: str) -> float:
    """Seconds between job status requests: the setting (unset: DEFAULT_POLL_S), at least MIN_QUALCOMM_POLL_S
    against Qualcomm's own AI Hub, which rate-limits an account's requests; faster only against another API
    (the emulator the tests run)."""
    from urllib.parse import urlparse

    from qai_hub.public_rest_api import DEFAULT_HUB_API_URL

    poll = float(settings.aihub_poll_interval_s or DEFAULT_POLL_S)
    host = (urlparse(api_url).hostname or "").lower()
    # workbench.aihub.qualcomm.com (the client's default) or app.aihub.qualcomm.com (older client.ini files)
    qualcomms = host == (urlparse(DEFAULT_HUB_API_URL).hostname or "") or host.endswith(".aihub.qualcomm.com")
    if poll < MIN_QUALCOMM_POLL_S and qualcomms:
        return MIN_QUALCOMM_POLL_S
    return poll


def configure_client(settings: RunSettings, api_url: str) -> float:
    """The client's knobs: job polling and HTTP retries. Returns our poll interval (seconds)."""
    import qai_hub.client as hc
    import qai_hub.util.session as hs

    poll = poll_interval(settings, api_url)
    hc.Job._polling_interval = max(1, int(poll))  # only used if a client call waits itself
    if settings.aihub_http_retries is not None:
        hs.MAX_RETRIES = settings.aihub_http_retries
    if settings.aihub_http_backoff_s is not None:
        hs.BACKOFF_FACTOR = float(settings.aihub_http_backoff_s)
    return poll


def client_config(settings: RunSettings, token: str | None = None) -> Any:
    from qai_hub import ClientConfig
    from qai_hub.api_utils import get_config_path, load_api_config_from_file
    from qai_hub.public_rest_api import DEFAULT_HUB_API_URL, DEFAULT_HUB_WEB_URL

    api_url = settings.aihub_api_url or os.environ.get("HEXSTUDIO_AIHUB_API_URL")
    web_url = settings.aihub_web_url or os.environ.get("HEXSTUDIO_AIHUB_WEB_URL")
    token = token or os.environ.get("HEXSTUDIO_AIHUB_TOKEN")
    if token:
        return ClientConfig(
            api_token=token,
            api_url=api_url or DEFAULT_HUB_API_URL,
            web_url=web_url or api_url or DEFAULT_HUB_WEB_URL,
            verbose=False,
        )
    ini = get_config_path()
    if os.path.exists(ini):
        try:
            cfg = load_api_config_from_file(ini)
        except Exception as exc:
            # the parser's own text quotes the bad line, which may be `api_token = <the token>`: never shown
            raise WorkerError(
                "aihub_token_missing",
                f"{ini} cannot be used: it is not the INI file qai_hub reads ({type(exc).__name__}).",
                "It needs an [api] section with api_token, api_url and web_url; run "
                "`qai-hub configure --api_token TOKEN`, or store the token in HexStudio's "
                "keyring instead (" + TOKEN_WHERE + ").",
            ) from None
        if api_url:
            cfg.api_url = api_url
            cfg.web_url = web_url or api_url
        cfg.verbose = False
        return cfg
    unread = keyring_unread()
    if unread:
        raise WorkerError(
            "aihub_token_missing",
            f"No Qualcomm AI Hub API token could be used: HexStudio's keyring could not be read, and {ini} "
            f"does not exist. The keyring said: {unread}",
            "Unlock or fix the keyring as above, then resume the run; or set HEXSTUDIO_AIHUB_TOKEN, or "
            "`qai-hub configure --api_token TOKEN`.",
        )
    raise WorkerError(
        "aihub_token_missing",
        f"No Qualcomm AI Hub API token was found (not in HexStudio's keyring, and {ini} does not exist).",
        "Copy your token from the AI Hub account page (https://app.aihub.qualcomm.com/account/) and "
        "store it: " + TOKEN_WHERE + ", or `qai-hub configure --api_token TOKEN`; then resume "
        "the run.",
    )


def storage_error(exc: BaseException) -> bool:
    """Whether `exc` is the object store's (boto3, botocore, s3transfer): the client moves files through Amazon S3
    with credentials AI Hub hands it, and those errors are neither qai_hub's nor requests'."""
    return any(c.__module__.split(".")[0] in ("botocore", "boto3", "s3transfer") for c in type(exc).__mro__)


@contextlib.contextmanager
def no_client_retries() -> Iterator[None]:
    """The client's own retries on a lost answer off, for a call that is not safe to repeat: a job submit whose
    answer was lost (a read time-out, a dropped connection) was POSTed again by the client, and AI Hub made a
    second job; an unanswered submit is looked up on resume instead (_HubCompile.submit_once). A connect time-out
    (nothing sent) and a 429 or 5xx answer are still retried as the client does."""
    import qai_hub.util.session as hs
    import requests

    transient = hs.TRANSIENT_HTTP_EXCEPTIONS
    hs.TRANSIENT_HTTP_EXCEPTIONS = (requests.exceptions.ConnectTimeout,)  # read when each call is made
    try:
        yield
    finally:
        hs.TRANSIENT_HTTP_EXCEPTIONS = transient


@contextlib.contextmanager
def quiet_hub_errors() -> Iterator[None]:
    """For a step whose failure only costs a convenience (a job's log): AI Hub's, the network's or the object
    store's error is passed over; any other is a bug and raised."""
    import qai_hub as hub
    from qai_hub.public_rest_api import APIException

    try:
        yield
    except (hub.Error, APIException, OSError):
        pass
    except Exception as exc:
        if not storage_error(exc):
            raise


@contextlib.contextmanager
def hub_errors(what: str, api_url: str, web_url: str, resume: bool = True) -> Iterator[None]:
    """Turn the client's exceptions into WorkerErrors a person can act on."""
    after = RESUME_HINT if resume else "Then try again."
    import qai_hub as hub
    from qai_hub.client import RateLimitedError
    from qai_hub.public_rest_api import APIException

    try:
        yield
    except WorkerError:
        raise
    except RateLimitedError as exc:
        raise WorkerError(
            "aihub_rate_limited",
            f"Qualcomm AI Hub is rate-limiting this account (429 Too Many "
            f"Requests) while {what}: {_first_line(exc)}",
            "Wait a few minutes (or for your other AI Hub jobs to finish). " + after,
        ) from None
    except hub.UserError as exc:
        text = str(exc)
        if "authenticate" in text or "API token" in text:
            raise WorkerError(
                "aihub_auth",
                f"Qualcomm AI Hub rejected the API token while {what} (bad or expired token).",
                f"Copy a fresh token from {web_url.rstrip('/')}/account/ and store it: "
                + TOKEN_WHERE
                # HexStudio's token (keyring, or the environment) is used before qai_hub's client.ini: a new token
                # there would change nothing
                + (
                    ""
                    if os.environ.get("HEXSTUDIO_AIHUB_TOKEN")
                    else ", or `qai-hub configure --api_token TOKEN`"
                )
                + ". "
                + after,
            ) from None
        if "not available" in text:
            raise WorkerError(
                "aihub_device_unavailable",
                f"Qualcomm AI Hub says the device is not available while {what}: {_first_line(exc)}",
                "Pick another device (Compile page; command line: a new run with --set device=NAME). "
                + after,
            ) from None
        raise WorkerError(
            "aihub_rejected",
            f"Qualcomm AI Hub refused {what}: {_first_line(exc)}",
            "Check the inputs named above. " + after,
        ) from None
    except hub.InternalError as exc:
        chain = _chain_text(exc)
        if says_429(chain):
            raise WorkerError(
                "aihub_rate_limited",
                f"Qualcomm AI Hub is rate-limiting this account (429 Too Many Requests) while {what}.",
                "Wait a few minutes (or for your other AI Hub jobs to finish). " + after,
            ) from None
        status = re.search(
            r"too many (5\d\d) error responses|\b(5\d\d) (?:Server Error|Service Unavailable)", chain
        )
        if status or "is unavailable right now" in chain:
            code = next((g for g in (status.groups() if status else ()) if g), None)
            raise WorkerError(
                "aihub_unavailable",
                f"Qualcomm AI Hub answered{' ' + code if code else ''} (the service "
                f"is unavailable or overloaded) while {what}: it was reached, it did not serve the request.",
                "This is on AI Hub's side: wait a few minutes and check its status page "
                f"({api_url}). " + after,
            ) from None
        if "Read timed out" in chain or "ReadTimeout" in chain:
            raise WorkerError(
                "aihub_timeout",
                f"Qualcomm AI Hub did not answer in time while {what} (it accepted the "
                "connection, then sent nothing before the client's read time-out).",
                "AI Hub or a proxy on the way is overloaded or stuck: try again in a few minutes. " + after,
            ) from None
        if any(t in chain for t in ("RemoteDisconnected", "Connection aborted", "reset by peer")):
            raise WorkerError(
                "aihub_connection_lost",
                f"The connection to Qualcomm AI Hub dropped while {what}, before AI Hub answered: AI Hub "
                "was reached and may have done what was asked (a job submitted is looked up on resume, not "
                "submitted twice).",
                "Check the network and any proxy on the way. " + after,
            ) from None
        if "connect" in chain.lower() or "Timeout" in chain:
            raise WorkerError(
                "aihub_unreachable",
                f"Could not reach Qualcomm AI Hub at {api_url} while {what}.",
                "Check the network and any proxy (HTTPS_PROXY/NO_PROXY) from this machine. " + after,
            ) from None
        raise WorkerError(
            "aihub_error",
            f"Qualcomm AI Hub failed while {what}: {_first_line(exc)}",
            "This is usually temporary on AI Hub's side. " + after,
        ) from None
    except APIException as exc:
        raise WorkerError(
            "aihub_error",
            f"Qualcomm AI Hub answered {exc.status_code} while {what}: {_first_line(exc)}",
            after,
        ) from None
    except Exception as exc:
        if not storage_error(exc):
            raise
        raise WorkerError(
            "aihub_storage",
            f"A file transfer through AI Hub's storage (Amazon S3) failed while {what}: {_first_line(exc)}",
            "AI Hub was reached, its storage was not: a proxy or firewall that lets *.aihub.qualcomm.com through "
            "must let Amazon S3 (*.amazonaws.com) through too. " + after,
        ) from None


# -- the jobs file -------------------------------------------------------------------------------
class JobStore:
    """<run>/aihub_jobs.json: {"key": inputs fingerprint, "jobs": {name: record}, "failed": [...], "earlier":
    {key: {"jobs", "failed"}}}. The jobs of earlier inputs are kept by their key (the last EARLIER_KEPT sets):
    inputs changed and changed back (a QAIRT version tried and undone) reuse their own finished jobs, never
    another set's."""

    EARLIER_KEPT = 8

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self.key = key
        doc: dict[str, Any] = {}
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            doc = {}
        earlier = doc.get("earlier")
        self.earlier: dict[str, dict[str, Any]] = dict(earlier) if isinstance(earlier, dict) else {}
        if doc.get("key") and doc.get("key") != key and doc.get("jobs"):
            self.earlier[str(doc["key"])] = {"jobs": doc.get("jobs") or {}, "failed": doc.get("failed") or []}
        mine = doc if doc.get("key") == key else self.earlier.pop(key, {})
        self.jobs: dict[str, dict[str, Any]] = dict(mine.get("jobs") or {})
        self.failed: list[dict[str, Any]] = list(mine.get("failed") or [])
        # submits sent without an answer yet: {name: {"what", "inputs", "t"}} (the resume looks them up)
        self.submitting: dict[str, dict[str, Any]] = dict(mine.get("submitting") or {})
        self.earlier = dict(list(self.earlier.items())[-self.EARLIER_KEPT :])

    @property
    def kept_for_earlier_inputs(self) -> int:
        """How many jobs earlier inputs have (kept, not reused for these)."""
        return sum(len(e.get("jobs") or {}) for e in self.earlier.values())

    def save(self) -> None:
        write_json_atomic(
            self.path,
            {
                "version": 1,
                "key": self.key,
                "jobs": self.jobs,
                "failed": self.failed,
                "submitting": self.submitting or None,
                "earlier": self.earlier or None,
            },
        )

    def put(self, name: str, rec: dict[str, Any]) -> None:
        self.jobs[name] = rec
        self.submitting.pop(name, None)
        self.save()

    def fail(self, name: str, reason: str) -> None:
        rec = self.jobs.pop(name)
        self.failed.append({**rec, "state": "FAILED", "reason": reason, "t": time.time()})
        self.save()


def hub_address_key(api_url: str) -> str:
    """What an AI Hub address adds to the job file's key: nothing for Qualcomm's own (qai_hub's default)."""
    from qai_hub.public_rest_api import DEFAULT_HUB_API_URL

    return "" if api_url.rstrip("/") == DEFAULT_HUB_API_URL.rstrip("/") else f"\n{api_url}"


def inputs_key(
    qdir: Path, q: dict[str, Any], device: str, qairt_version: str, model: str, extra_options: str = ""
) -> str:
    h = hashlib.sha256()
    h.update((qdir / "quantize.json").read_bytes())
    for g in q["graphs"]:
        gdir = (qdir / g["onnx"]).parent
        for p in sorted(gdir.iterdir()):
            h.update(f"{g['name']}/{p.name}:{p.stat().st_size}\n".encode())
        h.update(gb.sha256_file(qdir / g["encodings"]).encode())
    h.update(
        f"{device}\n{qairt_version}\n{compile_options('G', qairt_version, ['O'])}\n"
        f"{link_options(qairt_version)}\n{model}\n{extra_options}".encode()
    )
    return h.hexdigest()


def record_job(em: Emitter, name: str, rec: dict[str, Any]) -> None:
    """A job id as a metric event, emitted as soon as the job is submitted (or reused after a restart): the
    pipeline records metrics in run.json's stage entry, so the ids are there while the stage still waits,
    and after a crash or kill (they also stay in <run>/aihub_jobs.json for the resume)."""
    em.metric(f"aihub_{name.replace(':', '_')}", rec["job_id"], scope="job")


# -- the stage ---------------------------------------------------------------------------------
def _pairs(q: dict[str, Any], qdir: Path) -> dict[int, list[dict[str, Any]]]:
    """Each part's graphs in link order: its prompt processor and token generator, then the variants of other
    ARs and context lengths (ar_sizes, context_lengths), which the part's link job puts in the same context."""
    pairs: dict[int, dict[str, dict[str, Any]]] = {}
    extra: dict[int, list[dict[str, Any]]] = {}
    for g in [*q["graphs"], *(q.get("variants") or [])]:
        for k in ("onnx", "encodings"):
            if not g.get(k) or not (qdir / g[k]).is_file():
                raise WorkerError(
                    "missing_graph",
                    f"Graph {g['name']} has no AIMET export ({k}) to upload.",
                    "Re-run the Quantize stage.",
                )
        if "variant_of" in g:
            extra.setdefault(int(g["part"]), []).append(g)
        else:
            pairs.setdefault(int(g["part"]), {})[g["kind"]] = g
    for part, d in pairs.items():
        if set(d) != set(KINDS):
            raise WorkerError(
                "missing_graph",
                f"Part {part} lacks a {' or '.join(set(KINDS) - set(d))} graph.",
                "Re-run the Quantize stage.",
            )
    return {part: [d[k] for k in KINDS] + extra.get(part, []) for part, d in sorted(pairs.items())}


def resolve_device(client: Any, name: str, lpbq: bool) -> dict[str, Any]:
    if not name.strip():
        # get_devices(name="") is no filter at all: the account's first device would be compiled for
        raise WorkerError(
            "aihub_device_unavailable",
            "No AI Hub device is named (the run's device setting is empty).",
            "Set the device on the Compile page, or start a new run with --set device=NAME "
            "(`hexstudio bundle devices --aihub` lists them).",
        )
    # exactly the device asked for: AI Hub's name filter is not an equality
    devs = [d for d in client.get_devices(name=name) if d.name.casefold() == name.strip().casefold()]
    if not devs:
        names = sorted({d.name for d in client.get_devices()})
        raise WorkerError(
            "aihub_device_unavailable",
            f"Qualcomm AI Hub has no device named '{name}' available.",
            f"Pick one of: {', '.join(names[:12])}{' ...' if len(names) > 12 else ''} "
            "(Compile page; command line: a new run with --set device=NAME).",
        )
    d = devs[0]
    dev = parse_device(d.name, d.os, list(d.attributes))
    try:
        gb.check_device(dev, lpbq=lpbq)
    except gb.BundleError as exc:
        raise WorkerError(
            "device_unsupported", str(exc), "Choose a Hexagon v73+ device such as the Dragonwing IQ-9075 EVK."
        ) from None
    return dev


def list_devices(settings: RunSettings | None = None, token: str | None = None) -> DeviceListing:
    """The account's devices, live from AI Hub, each with whether a bundle can run on it (weight sharing v73+,
    LPBQ v69+) and why not. Blocking network call: the studio runs it in its own process
    (hexstudio/workers/aihub_devices.py). Raises WorkerError with the same codes as the stage."""
    s = settings or RunSettings()
    with contextlib.redirect_stdout(sys.stderr):
        import qai_hub as hub

        ccfg = client_config(s, token)
        configure_client(s, ccfg.api_url)
        with hub_errors("listing devices", ccfg.api_url, ccfg.web_url, resume=False):
            devs = hub.Client(config=ccfg).get_devices()
    rows = []
    for d in devs:
        row = parse_device(d.name, d.os, list(d.attributes))
        try:
            gb.check_device(row, lpbq=True)
            row.update(supported=True, reason="")
        except gb.BundleError as exc:
            row.update(supported=False, reason=str(exc))
        rows.append(AihubDevice.from_json(row))
    return DeviceListing(tuple(sorted(rows, key=lambda r: (not r.supported, r.name))))


# what a poll may meet while the jobs run on regardless: waited out for a while, not the end of the stage
TRANSIENT_POLL = (
    "aihub_rate_limited",
    "aihub_unavailable",
    "aihub_timeout",
    "aihub_connection_lost",
    "aihub_unreachable",
)
POLL_GRACE_S = 900.0
POLL_RETRY_S = 15.0


def poll_status(
    job: Any, errs: Any, label: str, em: Emitter, sleep: Callable[[float], None] = time.sleep
) -> Any:
    """A job's status. A rate limit, an overloaded AI Hub or a lost connection while polling is waited out (up to
    POLL_GRACE_S): one 429 burst during hours of waiting on N jobs ended the stage, although the jobs ran on."""
    t0, wait = time.monotonic(), POLL_RETRY_S
    while True:
        try:
            with errs(f"polling {label}"):
                return job.get_status()
        except WorkerError as exc:
            if exc.code not in TRANSIENT_POLL or time.monotonic() - t0 > POLL_GRACE_S:
                raise
            em.log(f"{exc.message} Asking again in {wait:.0f} s (the job runs on meanwhile).")
            sleep(wait)
            wait = min(wait * 2, 300.0)


def wait_jobs(
    client: Any,
    store: JobStore,
    names: list[str],
    em: Emitter,
    poll_s: float,
    f0: float,
    f1: float,
    what: str,
    logs_dir: Path,
    errs: Any,
) -> None:

    jobs = {}
    missing = []
    for n in names:
        rec = store.jobs[n]
        try:
            with errs(f"looking up {what} job {rec['job_id']}"):
                jobs[n] = client.get_job(rec["job_id"])
        except WorkerError as exc:
            if exc.code != "aihub_rejected" or "could not be found" not in exc.message:
                raise
            # every missing one is found now: one resume submits them all again, not one a resume
            missing.append(f"{rec['kind']} job {rec['job_id']} for {rec['what']}")
            store.fail(n, "the job is no longer on AI Hub (deleted, expired or another account)")
    if missing:
        raise WorkerError(
            "aihub_job_missing",
            f"{len(missing)} AI Hub job(s) recorded before a restart are no longer on AI Hub (deleted, expired, "
            f"or the token belongs to another account): {'; '.join(missing[:5])}"
            + (f"; and {len(missing) - 5} more" if len(missing) > 5 else "")
            + ".",
            "Resume the run: those jobs are submitted again; the other recorded jobs are reused.",
        )
    pending = set(names)
    em.log(f"waiting for AI Hub {what} jobs: " + ", ".join(f"{n} {store.jobs[n]['job_id']}" for n in names))
    last_msg, last_t = "", 0.0
    given_up = time.monotonic() + WAIT_LIMIT_S
    while pending:
        states = {}
        for n in sorted(pending):
            st = poll_status(jobs[n], errs, f"{what} job {store.jobs[n]['job_id']}", em)
            states[n] = st.code
            if st.success:
                pending.discard(n)
                store.jobs[n]["state"] = "SUCCESS"
                store.save()
            elif st.failure:
                rec = store.jobs[n]
                reason = st.message or "no reason given"
                log_note = ""
                with quiet_hub_errors():
                    got = jobs[n].download_job_logs(str(logs_dir))
                    if got:
                        log_note = f" The job's log is in {got[0]}."
                store.fail(n, reason)
                raise WorkerError(
                    "aihub_job_failed",
                    f"AI Hub {rec['kind']} job {rec['job_id']} for {rec['what']} failed: {reason}",
                    f"Details: {rec['url']}.{log_note} Fix the cause and resume the run: only this "
                    "job is submitted again; the jobs that succeeded are reused.",
                )
        done = len(names) - len(pending)
        msg = f"AI Hub {what}: {done}/{len(names)} done" + (
            f"; waiting ({', '.join(sorted(set(states.values()) - {'SUCCESS'}))})" if pending else ""
        )
        now = time.monotonic()
        if msg != last_msg or now - last_t > 30:
            em.progress(f0 + (f1 - f0) * done / len(names), msg)
            last_msg, last_t = msg, now
        if pending and time.monotonic() > given_up:
            # a job AI Hub never finishes (a state this client does not know reads as UNSPECIFIED, neither done
            # nor failed) would hold the stage for ever; the recorded jobs are waited for again on resume
            waiting = ", ".join(f"{store.jobs[n]['job_id']} ({states.get(n, '?')})" for n in sorted(pending))
            raise WorkerError(
                "aihub_timeout",
                f"AI Hub {what} jobs are still not finished after {WAIT_LIMIT_S / 3600:g} h: {waiting}.",
                "Look at them on AI Hub (the job pages); resume the run later: the recorded jobs are waited for "
                "again, nothing is submitted twice.",
            )
        if pending:
            time.sleep(poll_s)


def stage_aimet_dir(
    g: dict[str, Any], qdir: Path, dest: Path, base: str, compact: bool = True
) -> tuple[Path, UploadStats]:
    """`dest/<base>.aimet/` holding `<base>.onnx`, `<base>.data` and `<base>.encodings` for graph entry `g`,
    as qai-hub-models' split_onnx writes each part, with the integer-encoded weights and the embedding table as
    their integers (checked to re-quantize to the same integers; hexstudio/workers/aihub_upload.py): about a
    quarter of the bytes of the fp32 part. `compact=False`: fp32, as qai-hub-models uploads."""
    try:
        return write_upload_dir(qdir / g["onnx"], qdir / g["encodings"], dest, base, compact)
    except UploadError as exc:
        raise WorkerError(
            "missing_graph", f"Graph {g['name']}: {exc}.", "Re-run the Quantize stage."
        ) from None


DEFAULT_LINK_MBPS = 100.0  # assumed upload link speed when setting aihub_link_mbps is unset


def link_speed(settings: RunSettings, measured: UplinkRate | None = None) -> tuple[float, str]:
    """(Mbit/s, where it comes from): setting aihub_link_mbps, else what the last upload to this AI Hub measured
    (workers/aihub_uplink.py), else an assumed 100 Mbit/s."""
    v = settings.aihub_link_mbps
    if v:
        return float(v), "setting aihub_link_mbps"
    if measured is not None:
        return measured.mbps, measured.source()
    return DEFAULT_LINK_MBPS, "assumed; set aihub_link_mbps to your uplink"


def eta_text(n_bytes: float, mbps: float) -> str:
    s = n_bytes * 8 / (mbps * 1e6)
    return f"{s / 3600:.1f} h" if s >= 5400 else (f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s")


def upload_plan(
    pairs: dict[int, list[dict[str, Any]]], qdir: Path, skip: set[str], compact: bool = True
) -> dict[str, int]:
    """Bytes each graph's upload will hold (graphs named in `skip`, already compiled, are left out)."""
    return {
        g["name"]: plan_bytes(qdir / g["onnx"], qdir / g["encodings"], compact)
        for graphs in pairs.values()
        for g in graphs
        if g["name"] not in skip
    }


def qairt_of_model(model: Any) -> str | None:
    """The full QAIRT version AI Hub records on a compiled model (QAIRT_SDK_VERSION, else QNN_SDK_VERSION)."""
    from qai_hub import ModelMetadataKey

    meta = model.metadata
    return meta.get(ModelMetadataKey.QAIRT_SDK_VERSION) or meta.get(ModelMetadataKey.QNN_SDK_VERSION) or None


@dataclass
class _HubCompile:
    """One compile's AI Hub side: the client, the device, the job records and where messages go."""

    client: Any
    device: Any
    store: JobStore
    em: Emitter
    api_url: str
    web_url: str
    poll_s: float
    logs_dir: Path

    def errs(self, what: str) -> contextlib.AbstractContextManager[None]:
        return hub_errors(what, self.api_url, self.web_url)

    def reuse(self, name: str, what: str) -> bool:
        """Whether job `name` was submitted before a restart (then it is recorded again, not submitted)."""
        if name not in self.store.jobs:
            return False
        self.em.log(f"reusing AI Hub {name.split(':')[0]} job {self.store.jobs[name]['job_id']} for {what}")
        record_job(self.em, name, self.store.jobs[name])
        return True

    def submit_once(
        self, name: str, kind: str, what: str, inputs: list[str], submit: Callable[[], Any]
    ) -> Any:
        """Job `name` submitted, or the job an earlier submit of the same inputs created without answering (a
        time-out or a dropped connection after AI Hub took it): submitted again, it would be a second job."""
        job = self._unanswered(name, kind, inputs)
        if job is not None:
            return job
        self.store.submitting[name] = {"what": what, "inputs": inputs, "t": time.time()}
        self.store.save()
        with self.errs(f"submitting the {kind} job {what}"), no_client_retries():
            return submit()

    def _unanswered(self, name: str, kind: str, inputs: list[str]) -> Any | None:
        """The job AI Hub lists for an unanswered submit of `name` with these inputs (None: there is none)."""
        sent = self.store.submitting.get(name)
        if sent is None or sent.get("inputs") != inputs:
            return None
        import qai_hub as hub

        # the jobs this run has recorded, the failed ones too: a job that failed was made by an earlier submit
        # of the same inputs, and is no answer to this one
        known = {r["job_id"] for r in (*self.store.jobs.values(), *self.store.failed)}
        since = float(sent["t"]) - CLOCK_SKEW_S
        what = str(sent["what"])
        try:
            with self.errs(f"looking up the {kind} job {what} an earlier submit may have made"):
                for offset in range(0, LOOKUP_PAGES * LOOKUP_PAGE, LOOKUP_PAGE):
                    page = self.client.get_job_summaries(
                        offset=offset,
                        limit=LOOKUP_PAGE,
                        type=hub.JobType.COMPILE if kind == "compile" else hub.JobType.LINK,
                    )
                    for summary in page:
                        if (
                            summary.name != what
                            or summary.job_id in known
                            or summary.date.timestamp() < since
                        ):
                            continue
                        job = self.client.get_job(summary.job_id)
                        got = [job.model.model_id] if kind == "compile" else [m.model_id for m in job.models]
                        if got == inputs:
                            self.em.log(
                                f"AI Hub had taken the {kind} job {job.job_id} ({what}) whose submit did not "
                                "answer: it is used, not submitted again"
                            )
                            return job
                    # newest first: the rest are older than the submit
                    if len(page) < LOOKUP_PAGE or any(x.date.timestamp() < since for x in page):
                        break
        except WorkerError as exc:
            self.em.warning(
                f"Could not ask AI Hub whether the earlier submit of {what} made a job ({exc.message}). It is "
                "submitted again; if the earlier one was made, AI Hub lists both (only the new one is used).",
                code="aihub_lookup_failed",
            )
        return None

    def submitted(self, name: str, rec: dict[str, Any]) -> None:
        """A job id on disk at once (the resume needs it), then as a metric event."""
        self.store.put(name, rec)
        record_job(self.em, name, self.store.jobs[name])

    def wait(self, names: list[str], f0: float, f1: float, what: str) -> None:
        wait_jobs(
            self.client, self.store, names, self.em, self.poll_s, f0, f1, what, self.logs_dir, self.errs
        )


@dataclass
class _Upload:
    """The uploads' bytes: planned per graph, left to send, sent so far and how long that took (the measured
    rate is kept in the workspace for the next compile's ETA)."""

    plan: dict[str, int]
    workspace: Path
    staging: Path
    compact: bool
    left: float = 0.0
    sent: float = 0.0
    sent_s: float = 0.0


def _compile_graphs(
    hc: _HubCompile,
    pairs: dict[int, list[dict[str, Any]]],
    qdir: Path,
    names: dict[str, str],
    options_of: Callable[[dict[str, Any]], str],
    up: _Upload,
    parts: int,
) -> None:
    """Step 1: upload each graph and submit its compile job, unless a job was recorded before a restart."""
    em = hc.em
    n_graphs = sum(len(graphs) for graphs in pairs.values())
    i = 0
    for part, graphs in pairs.items():
        for g in graphs:
            name = f"compile:{g['name']}"
            job_name = names[g["name"]]
            i += 1
            if hc.reuse(name, f"{g['name']} (submitted before a restart)"):
                continue  # not in the upload's plan
            em.progress(
                0.03 + 0.3 * i / n_graphs,
                f"AI Hub: uploading {job_name}.aimet ({i}/{n_graphs})",
                part=part,
                parts=parts,
            )
            options = options_of(g)
            uploaded = _uploaded_before(hc, name) or _upload_graph(hc, g, qdir, job_name, up)
            job = hc.submit_once(
                name,
                "compile",
                job_name,
                [uploaded.model_id],
                functools.partial(
                    hc.client.submit_compile_job,
                    uploaded,
                    hc.device,
                    name=job_name,
                    options=options,
                    retry=False,
                ),
            )
            rec = {
                "kind": "compile",
                "part": part,
                "graph": g["name"],
                "what": job_name,
                "job_id": job.job_id,
            }
            hc.submitted(name, {**rec, "url": job.url, "state": "SUBMITTED", "options": options})
            em.log(f"submitted AI Hub compile job {job.job_id} ({job_name}, graph {g['name']}): {job.url}")
    shutil.rmtree(up.staging, ignore_errors=True)


def _uploaded_before(hc: _HubCompile, name: str) -> Any | None:
    """The model an unanswered submit of job `name` had uploaded (the same inputs: the store's key), so a
    resume does not send it again; None when there is none or AI Hub no longer has it."""
    sent = hc.store.submitting.get(name)
    if sent is None:
        return None
    try:
        with hc.errs("looking up an earlier upload"):
            model = hc.client.get_model(sent["inputs"][0])
    except WorkerError:
        return None
    hc.em.log(f"reusing the upload {model.model_id} of {sent['what']} (made before a restart)")
    return model


def _upload_graph(hc: _HubCompile, g: dict[str, Any], qdir: Path, job_name: str, up: _Upload) -> Any:
    """One graph's .aimet folder uploaded, the measured rate kept for the next ETA; the uploaded model."""
    em = hc.em
    src, ustats = stage_aimet_dir(g, qdir, up.staging, job_name, up.compact)
    if ustats.inexact:
        em.warning(
            f"{len(ustats.inexact)} weight(s) of {g['name']} are uploaded in fp32: their integer form "
            f"would not re-quantize to the same integers ({', '.join(ustats.inexact[:3])}).",
            code="aihub_upload_fp32",
        )
    t_up = time.monotonic()
    try:
        with hc.errs(f"uploading {src.name}"):
            uploaded = hc.client.upload_model(str(src))
    finally:
        shutil.rmtree(src, ignore_errors=True)
    up.sent += ustats.bytes
    up.sent_s += time.monotonic() - t_up
    # the next compile's ETA
    record_rate(up.workspace, hc.api_url, up.sent, up.sent_s)
    up.left = max(0.0, up.left - up.plan.get(g["name"], ustats.bytes))
    rate = up.sent * 8 / max(up.sent_s, 1e-3) / 1e6
    em.log(
        f"uploaded {src.name}: {ustats.bytes / 1e9:.2f} GB ({ustats.int_params / 1e6:.0f}M weights in "
        f"{ustats.int_tensors} tensors as integers, {ustats.fp32_params / 1e6:.0f}M fp32) in "
        f"{time.monotonic() - t_up:.0f} s (zip + send: {rate:.0f} Mbit/s measured); {up.left / 1e9:.2f} GB left, "
        f"ETA {eta_text(up.left, rate)}"
    )
    em.metric("upload_sent_bytes", int(up.sent), "B")
    return uploaded


def _link_parts(
    hc: _HubCompile, pairs: dict[int, list[dict[str, Any]]], bins: dict[int, str], qairt: str
) -> None:
    """Step 2: link each part's DLCs, [prompt, token, other ARs' and CLs'], into one context binary with
    shared weights."""
    for part, graphs in pairs.items():
        name = f"link:part{part}"
        link_name = bins[part][: -len(".bin")]
        if hc.reuse(name, f"part {part}"):
            continue
        with hc.errs(f"reading the compiled models of {link_name}"):
            models = [
                hc.client.get_job(hc.store.jobs[f"compile:{g['name']}"]["job_id"]).get_target_model()
                for g in graphs
            ]
        job = hc.submit_once(
            name,
            "link",
            link_name,
            [m.model_id for m in models],
            functools.partial(
                hc.client.submit_link_job, models, hc.device, name=link_name, options=link_options(qairt)
            ),
        )
        rec = {"kind": "link", "part": part, "graph": None, "what": link_name, "job_id": job.job_id}
        hc.submitted(name, {**rec, "url": job.url, "state": "SUBMITTED", "options": link_options(qairt)})
        hc.em.log(f"submitted AI Hub link job {job.job_id} ({link_name}): {job.url}")


def _download_bins(
    hc: _HubCompile, parts: list[int], bins: dict[int, str], bdir: Path, job_logs: Path
) -> tuple[dict[int, str | None], bool]:
    """Step 3: each part's context binary into the bundle; (the QAIRT version AI Hub recorded on each linked
    model, whether any binary is an emulator's package)."""

    full_versions: dict[int, str | None] = {}
    emulated = False
    for k, part in enumerate(parts):
        rec = hc.store.jobs[f"link:part{part}"]
        hc.em.progress(0.8 + 0.15 * k / len(parts), f"AI Hub: downloading {bins[part]}")
        with (
            hc.errs(f"downloading the context binary of part {part} (job {rec['job_id']})"),
            tempfile.TemporaryDirectory(dir=bdir.parent) as tmp,
        ):
            job = hc.client.get_job(rec["job_id"])
            target = job.get_target_model()
            got = job.download_target_model(tmp)
            if not got or target is None:
                raise WorkerError(
                    "aihub_download",
                    f"AI Hub link job {rec['job_id']} has no context binary.",
                    f"Details: {rec['url']}. " + RESUME_HINT,
                )
            os.replace(got, bdir / bins[part])
            full_versions[part] = qairt_of_model(target)
            with quiet_hub_errors():
                job.download_job_logs(str(job_logs))
        emulated = emulated or is_emulated_package(bdir / bins[part])
    return full_versions, emulated


def linked_qairt(full_versions: dict[int, str | None], requested: str, em: Emitter) -> str:
    """The one full QAIRT version every part was linked with (the requested one where AI Hub recorded none)."""
    if len(set(full_versions.values())) > 1:
        raise WorkerError(
            "aihub_qairt_mismatch",
            "AI Hub linked the parts with different QAIRT versions ("
            + ", ".join(f"part {p}: {v}" for p, v in full_versions.items())
            + ").",
            "Remove the run's aihub_jobs.json and compile again with one QAIRT version: set it on the Compile "
            "page (QAIRT version), or start a new run with `--set qairt_version=X` (a resumed run keeps its "
            "settings).",
        )
    first = next(iter(full_versions.values()))
    if first is None:
        em.warning(
            f"AI Hub recorded no QAIRT version on the linked models; tool-versions.yaml holds the requested "
            f"{requested}.",
            code="aihub_qairt_unknown",
        )
    return first or requested


def _write_bundle_files(
    bdir: Path,
    hf_dir: Path,
    dev: dict[str, Any],
    meta_doc: dict[str, Any],
    qairt_full: str,
    emulated: bool,
    write_dialogs: Callable[[Path], object],
) -> None:
    """Step 4: the rest of the bundle beside the context binaries."""
    shutil.copy2(hf_dir / "tokenizer.json", bdir / "tokenizer.json")
    for extra in ("tokenizer_config.json", "config.json"):
        if (hf_dir / extra).is_file():
            shutil.copy2(hf_dir / extra, bdir / extra)
    # genie_config.json, and one genie_config.<type>.json per speculative dialog asked for (spd's draft under draft/)
    write_dialogs(bdir)
    (bdir / "htp_backend_ext_config.json").write_text(json.dumps(gb.htp_ext_config(dev), indent=2))
    gm.write_metadata(bdir / "metadata.yaml", meta_doc)
    head = (
        "# EMULATED: compiled by HexStudio's AI Hub emulator, which packages its inputs; no QAIRT ran.\n"
        if emulated
        else ""
    )
    (bdir / "tool-versions.yaml").write_text(f"{head}qairt: {qairt_full}\n")
    if emulated:
        (bdir / "EMULATED.txt").write_text(
            "This bundle was compiled by HexStudio's AI Hub EMULATOR (tests/aihub_emulator).\n"
            "Its .bin files are zip packages of the inputs, not QNN context binaries: Genie cannot load them.\n"
        )


def compile_bundle(spec: WorkerSpec, model_doc: dict[str, Any], qdir: Path, em: Emitter) -> dict[str, Any]:
    s = spec.settings
    if not s.aihub_consent:
        raise WorkerError(
            "aihub_consent_required",
            "Compiling on Qualcomm AI Hub uploads model-derived files "
            "(the quantized ONNX graphs and their encodings) to Qualcomm's cloud, and you have "
            "not agreed to that for this run.",
            "Give consent on the Compile page (command line: start the run with --set aihub_consent=true), "
            "or compile for the simulator board instead (compile_target sim).",
        )
    q = json.loads((qdir / "quantize.json").read_text())
    pairs = _pairs(q, qdir)
    hf_dir = modelinfo.hf_dir_of(model_doc, spec.upstream_dir("model"))
    hf_config = json.loads((hf_dir / "config.json").read_text())
    model = model_name(model_doc, s)
    every = [g for graphs in pairs.values() for g in graphs]
    main = gm.main_variant([str(g["name"]) for g in every])
    try:
        names = {g["name"]: graph_job_name(model, g["name"], main) for g in every}
        bins = {part: bin_name(model, graphs[0]["name"]) for part, graphs in pairs.items()}
        precision = gm.precision_name(q)
        # reads every graph's I/O: before any upload
        meta_doc = gm.build_metadata(every, qdir, precision)
    except gm.MetadataError as exc:
        raise WorkerError(
            "bundle_check", str(exc), "Re-run the Quantize stage (nothing was uploaded)."
        ) from None

    # the Genie configs and the speculative dialogs are checked before any upload
    cfg = checked_genie_config(hf_config, hf_dir, q, [bins[k] for k in pairs], s)
    tok = hf_dir / "tokenizer.json"
    # the device as known offline (AI Hub resolves it later) and the QAIRT asked for: a draft that could not load
    # beside this bundle is refused before any upload (a device not known offline: once AI Hub named it, below)
    known = gb.KNOWN_DEVICES.get(s.device) or {}
    tok_bytes = tok.read_bytes() if tok.is_file() else None

    def check_draft(device: dict[str, Any]) -> None:
        host = DraftHost.on(q["context_length"], device, s.qairt_version)
        check_speculative(hf_config, q, s, tok_bytes, clamps_small_tables=False, host=host)

    check_draft(known)
    qairt = s.qairt_version
    lpbq = "lpbq" in str((q.get("precision") or {}).get("weights", "")).lower()
    # appended, as qai-hub-models' --compile-options
    extra_options = str(s.aihub_compile_options).strip()

    def options_of(g: dict[str, Any]) -> str:
        comp = gm.variant_component(str(g["name"]), *main)
        outputs = list(g.get("outputs") or meta_doc["components"][comp]["outputs"])
        options = compile_options(g["name"], qairt, outputs)
        return f"{options} {extra_options}" if extra_options else options

    bdir = spec.out_dir / "bundle"
    # the client prints; stdout is the protocol
    with contextlib.redirect_stdout(sys.stderr):
        import qai_hub as hub

        ccfg = client_config(s)
        poll_s = configure_client(s, ccfg.api_url)
        if poll_s > float(s.aihub_poll_interval_s or poll_s):
            em.log(
                f"polling AI Hub every {poll_s:g} s, not every {s.aihub_poll_interval_s:g} s as set: Qualcomm's AI "
                "Hub limits an account's requests"
            )
        client = hub.Client(config=ccfg)
        em.log(f"AI Hub: looking up {s.device}")
        with hub_errors(f"looking up the device {s.device}", ccfg.api_url, ccfg.web_url):
            dev = resolve_device(client, s.device, lpbq)
        if (
            not known
        ):  # its Hexagon arch and SoC model are AI Hub's word now: the draft is checked against them
            check_draft(dev)
        if dev["emulated"]:
            em.warning(
                "This AI Hub is the HexStudio emulator: the context binaries are EMULATED packages, not "
                "device results.",
                code="emulated",
            )
        store = JobStore(
            spec.run_dir / JOBS_FILE,
            # the AI Hub address too: another one (the emulator, then Qualcomm's) knows none of the recorded jobs.
            # Qualcomm's own adds nothing, so the job files of runs compiled before keep their key
            inputs_key(qdir, q, dev["name"], qairt, model, extra_options + hub_address_key(ccfg.api_url)),
        )
        # the upload's size and ETA first, before anything is sent (the CLI prints a stage's first progress line):
        # the graphs whose compile jobs are recorded are not sent again
        submitted = {
            g["name"] for graphs in pairs.values() for g in graphs if f"compile:{g['name']}" in store.jobs
        }
        plan = upload_plan(pairs, qdir, submitted, s.aihub_compact_upload)
        workspace = spec.run_dir.parent.parent
        mbps, speed_from = link_speed(s, read_rate(workspace, ccfg.api_url))
        up = _Upload(plan, workspace, spec.out_dir / "aimet", s.aihub_compact_upload)
        up.left = float(sum(plan.values()))
        em.metric("upload_planned_bytes", int(up.left), "B")
        em.progress(
            0.01,
            f"AI Hub upload: {up.left / 1e9:.2f} GB in {len(plan)} graphs"
            + (f" ({len(submitted)} submitted before, not sent again)" if submitted else "")
            + (" (weights as their integers, with fp32 scales)" if s.aihub_compact_upload else " (fp32)")
            + f", ETA {eta_text(up.left, mbps)} at {mbps:g} Mbit/s ({speed_from}); the client zips each upload, "
            "so it may send less",
        )
        if kept := store.kept_for_earlier_inputs:
            em.warning(
                f"{kept} AI Hub job(s) recorded for earlier inputs (other graphs, device or QAIRT version) are not "
                "reused for these; they are kept, for those inputs.",
                code="aihub_jobs_kept",
            )
        logs_dir = spec.run_dir / "logs" / "aihub"
        hc = _HubCompile(
            client, hub.Device(dev["name"]), store, em, ccfg.api_url, ccfg.web_url, poll_s, logs_dir
        )
        _compile_graphs(hc, pairs, qdir, names, options_of, up, int(q["parts"]))
        hc.wait([f"compile:{g['name']}" for g in every], 0.35, 0.6, "compile")
        _link_parts(hc, pairs, bins, qairt)
        hc.wait([f"link:part{part}" for part in pairs], 0.6, 0.8, "link")
        bdir.mkdir(parents=True, exist_ok=True)
        full_versions, packaged = _download_bins(hc, list(pairs), bins, bdir, spec.out_dir / "aihub_logs")
    emulated = bool(dev["emulated"]) or packaged

    qairt_full = linked_qairt(full_versions, qairt, em)
    _write_bundle_files(
        bdir,
        hf_dir,
        dev,
        meta_doc,
        qairt_full,
        emulated,
        lambda d: write_dialog_configs(
            d, cfg, hf_config, q, s, runs_on=(dev, qairt_full), clamps_small_tables=False
        ),
    )
    recs = sorted(
        store.jobs.items(), key=lambda kv: (kv[1]["part"], kv[1]["kind"] != "compile", kv[1]["graph"] or "")
    )
    jobs = [{k: r.get(k) for k in ("part", "kind", "graph", "what", "job_id", "url")} for _, r in recs]
    device = {k: dev[k] for k in ("name", "soc_model", "dsp_arch", "attributes")}
    write_json_atomic(
        spec.out_dir / "compile.json",
        {
            "target": "aihub",
            "emulated": emulated,
            "device": device,
            "qairt_version": qairt,
            "qairt_full_version": qairt_full,
            "model_name": model,
            "jobs": [
                {**j, "state": r["state"], "options": r.get("options")}
                for j, (_, r) in zip(jobs, recs, strict=True)
            ],
            "failed_jobs": store.failed,
            "jobs_file": str(store.path),
        },
    )
    for name, r in recs:
        record_job(em, name, r)
    em.metric("aihub_jobs", len(jobs))
    em.progress(0.97, "writing bundle.json")
    return write_bundle_json(
        bdir,
        model_doc,
        q,
        device=device,
        qairt_version=qairt,
        emulated=emulated,
        target={"qairt_full_version": qairt_full, "precision": precision},
        aihub_jobs=jobs,
    )
