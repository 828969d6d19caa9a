"""Pure image mutations: base config + manifest + one appended layer -> new config and manifest.

What go-containerregistry's `mutate.Append`/`mutate.Config` do, as plain functions over dicts: no I/O,
so every byte of the result follows from the inputs (the reproducibility tests hash the output).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from patchkit.errors import PatchkitError
from patchkit.oci.layer import Layer
from patchkit.oci.media import (
    INDEX_TYPES,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    TO_OCI,
    Platform,
    descriptor,
)


def epoch_timestamp(epoch: int) -> str:
    """RFC 3339 UTC, second precision, as OCI configs carry `created`."""
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_env(env: list[str], updates: Mapping[str, str]) -> list[str]:
    """Replace variables in place (keeping the base's order), append new ones in the given order."""
    out = list(env)
    index = {item.split("=", 1)[0]: i for i, item in enumerate(out)}
    for key, value in updates.items():
        item = f"{key}={value}"
        if key in index:
            out[index[key]] = item
        else:
            index[key] = len(out)
            out.append(item)
    return out


class InvalidBaseImage(PatchkitError):
    """A base image whose manifest or config cannot be built on (exit 2): `part` "config" or "manifest",
    `expected` what a base must have there, `found` what it has."""

    def __init__(self, part: str, expected: str, found: str):
        self.part, self.expected, self.found = part, expected, found
        super().__init__(f"base image {part}: expected {expected}, found {found}")


def new_config(base_config: Mapping, layer: Layer, *, created: str, created_by: str, comment: str,
               labels: Mapping[str, str], env: Mapping[str, str], n_base_layers: int) -> dict:
    config = copy.deepcopy(dict(base_config))
    rootfs = config.get("rootfs")
    if not isinstance(rootfs, dict) or rootfs.get("type") != "layers" or not isinstance(rootfs.get("diff_ids"), list):
        raise InvalidBaseImage("config", "a rootfs of type layers with a diff_ids list", "none")
    if len(rootfs["diff_ids"]) != n_base_layers:
        raise InvalidBaseImage("config", f"{n_base_layers} diff_ids, one per manifest layer",
                               f"{len(rootfs['diff_ids'])}: the base image is inconsistent")
    rootfs["diff_ids"] = [*rootfs["diff_ids"], layer.diff_id]
    config["created"] = created
    history = list(config.get("history") or [])
    history.append({"created": created, "created_by": created_by, "comment": comment})
    config["history"] = history
    runtime = dict(config.get("config") or {})
    runtime["Labels"] = {**(runtime.get("Labels") or {}), **labels}
    runtime["Env"] = merge_env(runtime.get("Env") or [], env)
    config["config"] = runtime
    return config


def new_manifest(base_manifest: Mapping, config_bytes: bytes, layer: Layer,
                 annotations: Mapping[str, str]) -> dict:
    """An OCI manifest: the base's layers (descriptors renamed to OCI types) plus the new layer.

    The base's own annotations are not carried over: they describe the base, and the base is named by
    org.opencontainers.image.base.* instead.
    """
    if base_manifest.get("mediaType") in INDEX_TYPES:
        raise InvalidBaseImage("manifest", "an image manifest", "an index")
    layers = []
    for desc in base_manifest.get("layers") or []:
        desc = dict(desc)
        desc["mediaType"] = TO_OCI.get(desc["mediaType"], desc["mediaType"])
        layers.append(desc)
    layers.append(layer.descriptor())
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": descriptor(OCI_CONFIG, config_bytes),
        "layers": layers,
        "annotations": dict(annotations),
    }


def layout_index(manifest_bytes: bytes, platform: Platform, ref_name: str) -> dict:
    """The index.json of an OCI layout holding one image, tagged `ref_name`."""
    entry = descriptor(OCI_MANIFEST, manifest_bytes, platform=platform.as_dict(),
                       annotations={"org.opencontainers.image.ref.name": ref_name})
    return {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}
