"""The live AI Hub device list as both process sides read it: the worker that asks AI Hub
(hexstudio/workers/aihub_devices.py) writes `devices.json` with `DeviceListing.to_json()`; the studio's service
(hexstudio/core/services/aihub_devices.py) reads it back with `DeviceListing.read()`, for the Compile page and
`hexstudio bundle devices --aihub`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError

DEVICES_FILE = "devices.json"


class DeviceListingError(ActionableError, ValueError):
    """devices.json is missing a field or has one of the wrong type."""


@dataclass(frozen=True)
class AihubDevice:
    """One device of the account, with whether a Genie bundle can run on it (weight sharing on v73+, LPBQ on
    v69+) and, where not, why."""

    name: str
    os: str
    dsp_arch: str
    soc_model: int
    chipset: str | None
    weight_sharing: bool
    attributes: tuple[str, ...]
    emulated: bool  # listed by HexStudio's AI Hub emulator, not Qualcomm's service
    supported: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["attributes"] = list(self.attributes)
        return d

    @classmethod
    def from_json(cls, d: Any) -> AihubDevice:
        if not isinstance(d, dict):
            raise DeviceListingError(f"a device entry is {type(d).__name__}, not an object")

        def field_of(key: str, kind: type | tuple[type, ...]) -> Any:
            v = d.get(key)
            if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
                raise DeviceListingError(f"device {d.get('name')!r}: '{key}' is {v!r}")
            return v

        chipset = d.get("chipset")
        return cls(
            name=field_of("name", str),
            os=field_of("os", str),
            dsp_arch=field_of("dsp_arch", str),
            soc_model=field_of("soc_model", int),
            chipset=str(chipset) if chipset is not None else None,
            weight_sharing=field_of("weight_sharing", bool),
            attributes=tuple(str(a) for a in field_of("attributes", list)),
            emulated=field_of("emulated", bool),
            supported=field_of("supported", bool),
            reason=field_of("reason", str),
        )


@dataclass(frozen=True)
class DeviceListing:
    """The account's devices, the ones a bundle can run on first, then by name."""

    devices: tuple[AihubDevice, ...]

    @property
    def emulated(self) -> bool:
        return any(d.emulated for d in self.devices)

    @property
    def usable(self) -> tuple[AihubDevice, ...]:
        return tuple(d for d in self.devices if d.supported)

    def to_json(self) -> dict[str, Any]:
        return {"devices": [d.to_json() for d in self.devices], "emulated": self.emulated}

    @classmethod
    def from_json(cls, doc: Any) -> DeviceListing:
        if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
            raise DeviceListingError("no 'devices' list")
        return cls(tuple(AihubDevice.from_json(d) for d in doc["devices"]))

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> DeviceListing:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DeviceListingError(f"{path.name} cannot be read: {exc}") from None
        return cls.from_json(doc)


def offline_listing() -> DeviceListing:
    """The devices HexStudio knows without asking AI Hub (hexstudio.shared.bundle.KNOWN_DEVICES), all usable."""
    from hexstudio.shared.bundle import KNOWN_DEVICES

    return DeviceListing(
        tuple(
            AihubDevice(
                name=name,
                os=str(d["os"]),
                dsp_arch=str(d["dsp_arch"]),
                soc_model=int(d["soc_model"]),
                chipset=d.get("chipset"),
                weight_sharing=bool(d["weight_sharing"]),
                attributes=(),
                emulated=False,
                supported=True,
                reason="",
            )
            for name, d in KNOWN_DEVICES.items()
        )
    )
